"""One module per view; each exposes draw(ctx). Order here is the order of the view selector."""
from . import attention, block, norm, normlab, residual, rope, swiglu, tokens, whatif

VIEWS = [  # (key, English name, 中文名, draw)
    ("tokens", "Tokens & shapes", "Token 与形状", tokens.draw),
    ("attention", "Attention", "注意力", attention.draw),
    ("norm", "RMSNorm", "RMSNorm", norm.draw),
    ("rope", "RoPE", "RoPE", rope.draw),
    ("swiglu", "SwiGLU", "SwiGLU", swiglu.draw),
    ("residual", "Residual & prediction", "残差流与预测", residual.draw),
    ("block", "The block", "模块结构", block.draw),
    ("whatif", "What if…", "假如……", whatif.draw),
    ("normlab", "Pre vs Post-Norm lab", "Pre/Post-Norm 实验室", normlab.draw),
]
