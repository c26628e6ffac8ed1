"""Classroom prompts: each shows one idea from the tutorials on a real model."""

PRESETS: list[tuple[str, str, str]] = [  # (English label, 中文标签, prompt)
    ("Coreference: what is 'it'?", "指代：it 指谁？", "The animal didn't cross the street because it was too tired."),
    ("A short sentence", "一个短句", "I love machine learning."),
    ("Chinese: predict the next word", "中文：预测下一个词", "深度学习很"),
    ("Bank (money)", "bank（银行）", "The bank approved the loan."),
    ("Bank (river)", "bank（河岸）", "The bank near the river collapsed."),
    ("Induction: a repeated sequence", "归纳头：重复的序列",
     "red lamp cat seven tree blue moon door red lamp cat seven tree blue moon door"),
    ("A fact", "一个事实", "The capital of France is"),
    ("Chinese sentence", "中文句子", "今天天气很好，我们去公园散步。"),
    ("Chat template (special tokens)", "对话模板（特殊 token）",
     "<|im_start|>user\nWhat is RoPE?<|im_end|>\n<|im_start|>assistant\n"),
]

BANK_PAIR = ("The bank approved the loan.", "The bank near the river collapsed.")
