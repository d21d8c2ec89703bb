from mhjax.models import flops
from mhjax.models.transformer import Transformer, count_params

__all__ = ["Transformer", "count_params", "flops"]
