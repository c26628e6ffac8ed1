"""One module per view; each exposes draw(ctx). Order here is the order of the view selector; a view's name is the
catalog message `view.{key}`."""
from . import attention, block, norm, normlab, predict, residual, rope, swiglu, tokens, whatif

VIEWS = [  # (key, draw)
    ("tokens", tokens.draw),
    ("attention", attention.draw),
    ("norm", norm.draw),
    ("rope", rope.draw),
    ("swiglu", swiglu.draw),
    ("residual", residual.draw),
    ("predict", predict.draw),
    ("block", block.draw),
    ("whatif", whatif.draw),
    ("normlab", normlab.draw),
]
