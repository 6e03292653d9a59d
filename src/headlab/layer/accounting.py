"""Parameter and FLOP accounting of the attention layer, from its config alone (no module built).

Answers three questions users ask (../seeds threads 000–002): do more heads mean more
parameters (for the standard layer, no: heads split a fixed budget), do heads share weights
(in the ``shared`` variant they do, and its projections shrink as 1/n_heads²), and what a full
W_QK per head would cost instead of separate W_Q, W_K (the ``bilinear`` variant). Named
presets, sweeps over heads and their explanations are in ``headlab.layer.variants``.

Sizes as in ``headlab.layer.config``; L = S = ``seq_len`` (self-attention, batch 1). FLOPs are
2 per multiply-add; stages:
    "q, k, v projections"   the projection variant's own count (``projection_flops``)
    "scores"                2 · n_heads · L · S · qk_dim   (q kᵀ for every head)
    "talking-heads mixing"  the two (n_heads × n_heads) mixings, when enabled
    "weighted sum"          2 · n_heads · L · S · d_head_v  (pattern @ v)
    "output projection"     2 · L · n_heads · d_head_v · d_model
Softmax, masking, the score scale, rotary positions and bias additions are element-wise and
not counted (they are O(n_heads · L · S) or O(L · d), small next to the matrix multiplies).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from headlab.layer.config import AttentionConfig
from headlab.layer.projections import PROJECTIONS
from headlab.layer.talking_heads import TalkingHeads

__all__ = ["Accounting", "account"]


@dataclass(frozen=True)
class Accounting:
    """Parameters and forward FLOPs of one layer config.

    Attributes:
        config: the layer's config.
        seq_len: self-attention positions L (= S) the FLOPs are counted for, batch 1.
        parameters: module parameter name → numel, exactly the names of
            ``MultiHeadAttention(config).named_parameters()`` (``projection.*``, ``core.*``).
        flops: stage → forward FLOPs (see the module docstring; softmax not counted).
        qk_rank_bound: the largest rank any head's W_QK can have.
        total_parameters: sum of ``parameters``.
        parameters_per_head: ``total_parameters / n_heads``.
        total_flops: sum of ``flops``.
    """

    config: AttentionConfig
    seq_len: int
    parameters: dict[str, int]
    flops: dict[str, int]
    qk_rank_bound: int
    total_parameters: int = field(init=False)
    parameters_per_head: float = field(init=False)
    total_flops: int = field(init=False)

    def __post_init__(self) -> None:
        # Derived once here so that a total can never disagree with its parts.
        object.__setattr__(self, "total_parameters", sum(self.parameters.values()))
        object.__setattr__(self, "parameters_per_head", self.total_parameters / self.config.n_heads)
        object.__setattr__(self, "total_flops", sum(self.flops.values()))

    def to_dict(self) -> dict[str, Any]:
        """Returns: the fields as a JSON-ready dict (the config resolved)."""
        out = asdict(self)
        out["config"] = self.config.to_dict()
        return out


def account(config: AttentionConfig, *, seq_len: int = 128) -> Accounting:
    """Count the parameters and forward FLOPs of ``MultiHeadAttention(config)``.

    Args:
        config: the layer's config.
        seq_len: self-attention positions L (= S) for the FLOPs, batch 1.

    Returns:
        An ``Accounting``; nothing is allocated.

    Raises:
        TypeError: ``config`` is not an AttentionConfig.
        ValueError: ``seq_len`` is not a positive int.
    """
    if not isinstance(config, AttentionConfig):
        raise TypeError(f"config must be an AttentionConfig, got {type(config).__name__}")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len={seq_len!r} must be a positive int")
    c, projection, L = config, PROJECTIONS[config.projection], seq_len
    shapes = {f"projection.{n}": s for n, s in projection.parameter_shapes(c).items()}
    if c.talking_heads:
        shapes |= {f"core.{n}": s for n, s in TalkingHeads.parameter_shapes(c).items()}
    parameters = {name: _numel(shape) for name, shape in shapes.items()}

    stages = projection.projection_flops(c, L, L)
    output = stages.pop("output projection")
    flops = stages | {"scores": 2 * c.n_heads * L * L * projection.qk_dim(c)}
    if c.talking_heads:
        flops |= TalkingHeads.flops(c, L, L)
    flops |= {"weighted sum": 2 * c.n_heads * L * L * c.d_head_v, "output projection": output}
    return Accounting(config=c, seq_len=L, parameters=parameters, flops=flops,
                      qk_rank_bound=projection.qk_rank_bound(c))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n
