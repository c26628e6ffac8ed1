"""The teaching lab: the Pre/Post-Norm twins, their corpus, tokenizer and training, and the norm experiments."""
