"""bench/models.py: benchmark models built in code (no downloaded weights), plain torch only.

Five models of the suite, each with its real size by default and config knobs to shrink it
(the tests build them tiny):

    mlp       a small latency-bound MLP (4 x Linear 1024 + GELU)
    resnet50  ResNet-50 (bottlenecks [3, 4, 6, 3], 224 x 224 images)
    vit_b16   ViT-B/16 (patch 16, d=768, 12 layers, 12 heads, 224 x 224 images)
    bert      a BERT-base encoder (d=768, 12 layers, 12 heads, sequence 128)
    gpt2      a GPT-2-small forward (d=768, 12 layers, causal, tied LM head, sequence 128)

``SPECS[name].build(**knobs)`` makes the model, ``SPECS[name].inputs(model_knobs, batch, device)``
a batch of inputs for it; ``SPECS[name].tiny`` are knobs small enough for a CPU test.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


# -- MLP -----------------------------------------------------------------------------------------
class MLP(nn.Module):
    """A small MLP: at batch 1 its time is kernel launches, not arithmetic."""

    def __init__(self, dim_in: int = 512, hidden: int = 1024, depth: int = 4, out: int = 16):
        super().__init__()
        layers: list[nn.Module] = []
        width = dim_in
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.GELU()]
            width = hidden
        layers.append(nn.Linear(width, out))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


# -- ResNet-50 -----------------------------------------------------------------------------------
class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)))
        return F.relu(self.bn3(self.conv3(h)) + identity)


class ResNet(nn.Module):
    """torchvision's ResNet-50 layout (v1.5: stride in the 3x3 conv), written out."""

    def __init__(
        self,
        layers: tuple[int, ...] = (3, 4, 6, 3),
        width: int = 64,
        num_classes: int = 1000,
        image: int = 224,
    ) -> None:
        super().__init__()
        self.image = image
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        blocks: list[nn.Module] = []
        inplanes = width
        for i, count in enumerate(layers):
            planes = width * 2**i
            for j in range(count):
                blocks.append(Bottleneck(inplanes, planes, stride=2 if (i > 0 and j == 0) else 1))
                inplanes = planes * Bottleneck.expansion
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(inplanes, num_classes)
        for m in self.modules():  # a real-looking weight distribution keeps BN outputs sane
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


# -- transformer pieces (shared by ViT, BERT-style and GPT-2) ------------------------------------
class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, causal: bool = False) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        h = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(h.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """A pre-LayerNorm transformer block (ViT, GPT-2)."""

    def __init__(self, dim: int, heads: int, ff: int, causal: bool = False) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, causal)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, ff)
        self.fc2 = nn.Linear(ff, dim)
        self.approximate = "tanh" if causal else "none"  # GPT-2's gelu_new is the tanh form

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate=self.approximate))


# -- ViT-B/16 ------------------------------------------------------------------------------------
class ViT(nn.Module):
    """ViT-B/16 as in timm's vit_base_patch16_224: class token, learned positions, pre-LN."""

    def __init__(
        self,
        image: int = 224,
        patch: int = 16,
        dim: int = 768,
        depth: int = 12,
        heads: int = 12,
        ff: int = 3072,
        num_classes: int = 1000,
    ) -> None:
        super().__init__()
        self.image = image
        self.patch = nn.Conv2d(3, dim, patch, stride=patch)
        tokens = (image // patch) ** 2 + 1
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, tokens, dim) * 0.02)
        self.blocks = nn.Sequential(*[Block(dim, heads, ff) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.patch(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], dim=1) + self.pos
        h = self.norm(self.blocks(h))
        return self.head(h[:, 0])


# -- BERT-base encoder ---------------------------------------------------------------------------
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
        self.vocab = vocab
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


# -- GPT-2 small ---------------------------------------------------------------------------------
class GPT2(nn.Module):
    """A GPT-2-small forward: embeddings, 12 causal pre-LN blocks, final LN, tied LM head."""

    def __init__(
        self,
        vocab: int = 50257,
        dim: int = 768,
        heads: int = 12,
        layers: int = 12,
        max_len: int = 1024,
    ) -> None:
        super().__init__()
        self.vocab = vocab
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(max_len, dim)
        self.blocks = nn.Sequential(
            *[Block(dim, heads, 4 * dim, causal=True) for _ in range(layers)]
        )
        self.ln_f = nn.LayerNorm(dim)
        for name, p in self.named_parameters():  # GPT-2's init keeps the residual stream sane
            if name.endswith("weight") and p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if "proj" in name or "fc2" in name else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        h = self.ln_f(self.blocks(self.wte(input_ids) + self.wpe(positions)))
        return F.linear(h, self.wte.weight)  # logits (batch, seq, vocab)


# -- the registry ------------------------------------------------------------------------------
def _images(model: nn.Module, batch: int, device: torch.device, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    size = int(getattr(model, "image", 224))
    return torch.randn(batch, 3, size, size, generator=g).to(device)


def _tokens(seq: int) -> Callable[[nn.Module, int, torch.device, int], torch.Tensor]:
    def make(model: nn.Module, batch: int, device: torch.device, seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        vocab = int(getattr(model, "vocab", 30522))
        return torch.randint(0, vocab, (batch, seq), generator=g).to(device)

    return make


def _features(model: nn.Module, batch: int, device: torch.device, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    first = next(m for m in model.modules() if isinstance(m, nn.Linear))
    return torch.randn(batch, first.in_features, generator=g).to(device)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One model of the suite: how to build it and its inputs, and knobs that shrink it."""

    name: str
    title: str
    factory: Callable[..., nn.Module]
    make_inputs: Callable[[nn.Module, int, torch.device, int], torch.Tensor]
    tiny: dict[str, Any]

    def build(self, tiny: bool = False, **knobs: Any) -> nn.Module:
        """The model in eval mode with seeded weights (``tiny``: the test-sized config)."""
        torch.manual_seed(0)
        return self.factory(**{**(self.tiny if tiny else {}), **knobs}).eval()

    def inputs(
        self, model: nn.Module, batch: int, device: torch.device, seed: int = 0
    ) -> torch.Tensor:
        return self.make_inputs(model, batch, device, seed)


SEQ = 128  # BERT and GPT-2 sequence length

SPECS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("mlp", "MLP 512-4x1024-16", MLP, _features, {"dim_in": 16, "hidden": 32}),
        ModelSpec(
            "resnet50",
            "ResNet-50 (224x224)",
            ResNet,
            _images,
            {"layers": (1, 1), "width": 8, "num_classes": 10, "image": 32},
        ),
        ModelSpec(
            "vit_b16",
            "ViT-B/16 (224x224)",
            ViT,
            _images,
            {"image": 32, "patch": 16, "dim": 32, "depth": 2, "heads": 2, "ff": 64},
        ),
        ModelSpec(
            "bert",
            f"BERT-base encoder (seq {SEQ})",
            BertLikeEncoder,
            _tokens(SEQ),
            {"vocab": 100, "dim": 32, "heads": 2, "layers": 2, "ff": 64, "max_len": SEQ},
        ),
        ModelSpec(
            "gpt2",
            f"GPT-2 small (seq {SEQ})",
            GPT2,
            _tokens(SEQ),
            {"vocab": 100, "dim": 32, "heads": 2, "layers": 2, "max_len": SEQ},
        ),
    )
}
