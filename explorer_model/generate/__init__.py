"""Generation: sampling (greedy, temperature, top-k, top-p), the lean torch decode step and its compiled C twin."""
