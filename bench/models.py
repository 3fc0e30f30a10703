"""bench/models.py: the suite's models, built from the real libraries' classes and configs.

No weights are downloaded (the GPU machine has no network): every model is built from its
library's config with seeded random weights, in eval mode.

    resnet50            torchvision resnet50, 224 x 224 images
    vit_b_16            torchvision vit_b_16, 224 x 224 images
    mobilenet_v3_large  torchvision mobilenet_v3_large, 224 x 224 images
    convnext_tiny       timm convnext_tiny, 224 x 224 images
    bert                transformers BertModel, base config, sequence 128
    gpt2                transformers GPT2LMHeadModel, GPT-2 small config, sequence 128, no cache
    llama               transformers LlamaForCausalLM, a ~100M-parameter config, prefill of 128
                        tokens with use_cache=True (returns the KV cache it filled)
    mlp                 a plain-torch MLP (not part of the default suite; diagnostics and tests)

``SPECS[name].build(tiny=...)`` makes the model (``tiny``: a test-sized config of the same
library class), ``SPECS[name].inputs(batch, device, tiny=...)`` one batch of inputs, and
``SPECS[name].missing()`` says why the model cannot be built here ("" when it can).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

SEQ = 128  # the sequence models' length (BERT, GPT-2, Llama prefill)
IMAGE = 224
TINY_SEQ = 16
TINY_IMAGE = 32
SUITE = ["bert", "resnet50", "vit_b_16", "mobilenet_v3_large", "convnext_tiny", "gpt2", "llama"]


# -- torchvision -------------------------------------------------------------------------------
def _resnet50(tiny: bool) -> nn.Module:
    from torchvision.models import resnet18, resnet50

    return resnet18(num_classes=10) if tiny else resnet50()


def _vit_b_16(tiny: bool) -> nn.Module:
    from torchvision.models import VisionTransformer, vit_b_16

    if tiny:
        model = VisionTransformer(
            image_size=TINY_IMAGE,
            patch_size=16,
            num_layers=2,
            num_heads=2,
            hidden_dim=32,
            mlp_dim=64,
            num_classes=10,
        )
    else:
        model = vit_b_16()
    # torchvision starts the classifier at zero: every variant would return zeros and the
    # correctness columns would compare nothing. Random weights make the logits carry the errors.
    nn.init.normal_(model.heads.head.weight, std=0.02)
    return model


def _mobilenet_v3_large(tiny: bool) -> nn.Module:
    from torchvision.models import mobilenet_v3_large, mobilenet_v3_small

    model = mobilenet_v3_small(num_classes=10) if tiny else mobilenet_v3_large()
    # torchvision's initialisation with identity batch-norm statistics shrinks MobileNetV3's
    # activations layer by layer (its depthwise convolutions are initialised for a fan-out of
    # all channels) until the logits are noise: every variant then "matches" eager. Statistics
    # from random images, as training would give, keep the logits informative.
    return batch_norm_from_data(model, TINY_IMAGE if tiny else IMAGE)


def batch_norm_from_data(
    model: nn.Module, size: int, batches: int = 4, batch: int = 8
) -> nn.Module:
    """``model`` with each batch norm's running statistics computed from seeded random images
    of ``size`` x ``size`` (a cumulative average over ``batches`` batches), in eval mode."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # None: a cumulative average, not a moving one
    g = torch.Generator().manual_seed(1)
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(batch, 3, size, size, generator=g))
    for m, momentum in zip(norms, momenta, strict=True):
        m.momentum = momentum
    return model.eval()


# -- timm --------------------------------------------------------------------------------------
def _convnext_tiny(tiny: bool) -> nn.Module:
    import timm

    if tiny:
        return timm.create_model("convnext_atto", pretrained=False, num_classes=10)
    return timm.create_model("convnext_tiny", pretrained=False)


# -- transformers ------------------------------------------------------------------------------
def _bert(tiny: bool) -> nn.Module:
    from transformers import BertConfig, BertModel

    if tiny:
        config = BertConfig(
            vocab_size=100,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        )
    else:
        config = BertConfig()  # bert-base: 12 layers, d=768, 12 heads, vocabulary 30522
    return BertModel(config)


def _gpt2(tiny: bool) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    if tiny:
        config = GPT2Config(
            vocab_size=100,
            n_embd=32,
            n_layer=2,
            n_head=2,
            n_positions=64,
            use_cache=False,
            bos_token_id=0,
            eos_token_id=0,
        )
    else:
        config = GPT2Config(use_cache=False)  # GPT-2 small: 12 layers, d=768, 12 heads
    return GPT2LMHeadModel(config)


def _llama(tiny: bool) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    if tiny:
        config = LlamaConfig(
            vocab_size=100,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=64,
            use_cache=True,
        )
    else:  # ~100M parameters: 12 layers of d=768, grouped-query attention (4 KV heads)
        config = LlamaConfig(
            vocab_size=32000,
            hidden_size=768,
            intermediate_size=2048,
            num_hidden_layers=12,
            num_attention_heads=12,
            num_key_value_heads=4,
            max_position_embeddings=2048,
            tie_word_embeddings=True,
            use_cache=True,
        )
    return LlamaForCausalLM(config)


# -- plain torch -------------------------------------------------------------------------------
def _mlp(tiny: bool) -> nn.Module:
    """A small MLP: at batch 1 its time is kernel launches, not arithmetic."""
    dim_in, hidden = (16, 32) if tiny else (512, 1024)
    layers: list[nn.Module] = []
    width = dim_in
    for _ in range(4):
        layers += [nn.Linear(width, hidden), nn.GELU()]
        width = hidden
    return nn.Sequential(*layers, nn.Linear(width, 16))


# -- the registry ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One model of the suite: its library, how to build it and a batch of its inputs."""

    name: str
    title: str
    library: str  # the import name of the library it comes from ("torch" for plain torch)
    kind: str  # "image" (float images), "tokens" (token ids) or "features" (float vectors)
    factory: Callable[[bool], nn.Module]
    vocab: tuple[int, int] = (0, 0)  # token ids are drawn below this: (full size, tiny)
    convnet: bool = False  # channels_last applies (the expert hand's memory format)
    libraries: tuple[str, ...] = ()  # further imports the library needs

    def missing(self) -> str:
        """Why this model cannot be built here ("" when it can): a library that is not installed."""
        for lib in (self.library, *self.libraries):
            if importlib.util.find_spec(lib) is None:
                return (
                    f"{lib} is not installed here ({self.name} comes from {self.library}; "
                    "the GPU machine has it, this CPU machine's torch has no build of it)"
                )
        return ""

    def build(self, tiny: bool = False) -> nn.Module:
        """The model in eval mode with seeded random weights (``tiny``: a test-sized config)."""
        torch.manual_seed(0)
        return self.factory(tiny).eval()

    def inputs(
        self, batch: int, device: torch.device, tiny: bool = False, seed: int = 0
    ) -> torch.Tensor:
        """One batch of inputs: the single positional argument the model is called with."""
        g = torch.Generator().manual_seed(seed)
        if self.kind == "image":
            size = TINY_IMAGE if tiny else IMAGE
            return torch.randn(batch, 3, size, size, generator=g).to(device)
        if self.kind == "tokens":
            vocab = self.vocab[1] if tiny else self.vocab[0]
            seq = TINY_SEQ if tiny else SEQ
            return torch.randint(0, vocab, (batch, seq), generator=g).to(device)
        return torch.randn(batch, 16 if tiny else 512, generator=g).to(device)


def _spec(*args: Any, **kwargs: Any) -> ModelSpec:
    return ModelSpec(*args, **kwargs)


SPECS: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        _spec(
            "resnet50",
            "torchvision resnet50 (224x224)",
            "torchvision",
            "image",
            _resnet50,
            convnet=True,
        ),
        _spec("vit_b_16", "torchvision vit_b_16 (224x224)", "torchvision", "image", _vit_b_16),
        _spec(
            "mobilenet_v3_large",
            "torchvision mobilenet_v3_large (224x224)",
            "torchvision",
            "image",
            _mobilenet_v3_large,
            convnet=True,
        ),
        _spec(
            "convnext_tiny",
            "timm convnext_tiny (224x224)",
            "timm",
            "image",
            _convnext_tiny,
            convnet=True,
            libraries=("torchvision",),
        ),
        _spec(
            "bert",
            f"transformers BertModel, base (seq {SEQ})",
            "transformers",
            "tokens",
            _bert,
            vocab=(30522, 100),
        ),
        _spec(
            "gpt2",
            f"transformers GPT2LMHeadModel, small (seq {SEQ}, no cache)",
            "transformers",
            "tokens",
            _gpt2,
            vocab=(50257, 100),
        ),
        _spec(
            "llama",
            f"transformers LlamaForCausalLM, ~100M (prefill {SEQ}, KV cache)",
            "transformers",
            "tokens",
            _llama,
            vocab=(32000, 100),
        ),
        _spec("mlp", "MLP 512-4x1024-16 (plain torch)", "torch", "features", _mlp),
    )
}


def parameters(name: str) -> int:
    """The full-size model's parameter count, built on the meta device (no memory, no init)."""
    with torch.device("meta"):
        model = SPECS[name].factory(False)
    return sum(p.numel() for p in model.parameters())
