from mhjax.models import cost, flops
from mhjax.models.transformer import Transformer, count_params

__all__ = ["Transformer", "cost", "count_params", "flops"]
