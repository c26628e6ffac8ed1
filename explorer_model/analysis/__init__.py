"""What is not the model but reads it: measures (loss, logit lens, KL, head sweep). What-if runs change the
forward pass itself and live beside the model (explorer_model/interventions.py).

The concept data layer (numpy out, no torch needed by the caller; each function's docstring gives its formula):
objective (per-position next-token loss), attention_math (why √d_k, multi-head V / z / concat / W_O),
encodings (sinusoidal absolute encoding vs RoPE), ffn (position-wise FFN, gate kinds), costs (attention and
KV-cache cost from a config), lesson (which heads link two tokens, coreference / induction heads, the sink).
"""
