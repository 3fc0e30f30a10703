"""bench/models.py: benchmark models built in code (no downloaded weights)."""

from __future__ import annotations

import torch
from torch import nn


class BertLikeEncoder(nn.Module):
    """A BERT-base-sized encoder: token + position embeddings, 12 layers of d=768, 12 heads."""

    def __init__(
        self,
        vocab: int = 30522,
        dim: int = 768,
        heads: int = 12,
        layers: int = 12,
        ff: int = 3072,
        max_len: int = 512,
    ) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(max_len, dim)
        self.norm = nn.LayerNorm(dim)
        layer = nn.TransformerEncoderLayer(
            dim, heads, ff, dropout=0.0, activation="gelu", batch_first=True, norm_first=False
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.pool = nn.Linear(dim, dim)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        h = self.norm(self.tokens(input_ids) + self.positions(positions))
        h = self.encoder(h)
        return torch.tanh(self.pool(h[:, 0]))


def bert_inputs(batch: int, seq: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 30522, (batch, seq), generator=g).to(device)
