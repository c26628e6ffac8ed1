"""Compare mode's panels: two recordings side by side (views), the residual stream of both (stream), their figures (figs) and what they share (common)."""
