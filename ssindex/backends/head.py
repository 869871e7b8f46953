"""What follows the transformer: pooling, then the card's Dense and Normalize modules.

One torch module serves every backend: torch runs it, and the ONNX export and the
Core ML conversion trace it, so all three produce the same vectors.
"""

from __future__ import annotations

from typing import Any

from ssindex.backends.card import ModelCard

MAX_POOL_FILL = -1e9
"""What padding positions hold for max pooling (as sentence-transformers does)."""


def pool(hidden: Any, mask: Any, modes: tuple[str, ...]) -> Any:
    """The token states ``hidden`` (batch, seq, dim) pooled in float32, one block per
    mode, concatenated; ``mask`` marks real tokens (padding is on the right)."""
    import torch

    hidden = hidden.float()
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    counts = torch.clamp(weights.sum(1), min=1e-9)
    blocks = []
    for mode in modes:
        if mode == "cls":
            blocks.append(hidden[:, 0])
        elif mode == "max":
            blocks.append(hidden.masked_fill(weights == 0, MAX_POOL_FILL).max(1).values)
        elif mode == "mean":
            blocks.append((hidden * weights).sum(1) / counts)
        elif mode == "mean_sqrt_len":
            blocks.append((hidden * weights).sum(1) / torch.sqrt(counts))
        elif mode == "weightedmean":
            positions = torch.arange(1, hidden.shape[1] + 1, device=hidden.device)
            weighted = weights * positions[None, :, None].to(hidden.dtype)
            blocks.append((hidden * weighted).sum(1) / torch.clamp(weighted.sum(1), min=1e-9))
        elif mode == "lasttoken":
            last = (mask.sum(1) - 1).clamp(min=0).long()
            blocks.append(hidden[torch.arange(hidden.shape[0], device=hidden.device), last])
        else:
            raise ValueError(f"unknown pooling {mode!r}")
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=1)


def build_head(card: ModelCard) -> Any:
    """A ``torch.nn.Module`` mapping (token states, mask) to the card's vectors."""
    import torch
    from safetensors.torch import load_file

    class Normalize(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return torch.nn.functional.normalize(x, p=2, dim=1)

    layers: list[Any] = []
    for module in card.modules:
        if module == "normalize":
            layers.append(Normalize())
            continue
        assert not isinstance(module, str)
        linear = torch.nn.Linear(module.in_features, module.out_features, bias=module.bias)
        state = {k.removeprefix("linear."): v for k, v in load_file(module.path).items()}
        linear.load_state_dict(state)
        layers.append(linear)
        if module.activation == "tanh":
            layers.append(torch.nn.Tanh())

    class Head(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.Sequential(*layers)

        def forward(self, hidden: Any, mask: Any) -> Any:
            return self.layers(pool(hidden, mask, card.pooling))

    return Head().eval()

