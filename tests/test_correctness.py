"""tests/test_correctness.py: the comparison with eager: structure, dtype, NaN, tolerances."""

from __future__ import annotations

import pytest
import torch

from honed.pipeline.correctness import TF32, compare, eager_tolerance


def test_equal_outputs_pass_with_zero_error() -> None:
    x = torch.randn(4, 8)
    r = compare({"a": x, "b": [x, 3]}, {"a": x.clone(), "b": [x.clone(), 3]})
    assert r.ok and r.max_abs_error == 0.0 and r.min_cosine == 1.0


def test_small_float32_noise_passes_and_one_percent_fails() -> None:
    x = torch.randn(64, 64)
    assert compare(x, x + 1e-6).ok
    bad = compare(x, x * 1.01)
    assert not bad.ok
    assert bad.reason.startswith("wrong outputs: output 0 max abs error")
    assert bad.max_rel_error > 0.009


def test_reduced_precision_tolerance_is_looser() -> None:
    x = torch.randn(64, 64)
    y = x.bfloat16().float()
    assert not compare(x, y * 1.02).ok
    assert compare(x, y, reduced_precision=True).ok
    assert compare(x, y, reduced_precision=True).min_cosine > 0.999


def test_structure_shape_dtype_and_nan_mismatches_are_named() -> None:
    x = torch.randn(2, 3)
    assert "structure" in compare((x, x), [x, x]).reason
    assert "shape (3, 2)" in compare(x, x.t()).reason
    assert "dtype torch.float64" in compare(x, x.double()).reason
    nan = x.clone()
    nan[0, 0] = float("nan")
    assert compare(x, nan).reason.startswith("NaN outputs: output 0 has 1 NaN")
    assert compare(nan, nan.clone()).ok  # NaN where eager has NaN too is not a failure


def test_inf_where_eager_is_finite_is_counted_and_named() -> None:
    x = torch.randn(4, 4)
    bad = x.clone()
    bad[0, :2] = float("inf")
    bad[1, 0] = float("-inf")
    assert compare(x, bad).reason == (
        "Inf outputs: output 0 has 3 Inf values where eager has finite ones"
    )


def test_the_figures_are_those_of_the_finite_positions() -> None:
    torch.manual_seed(0)
    ref = torch.randn(32, 32)
    out = ref + 1e-5 * torch.randn(32, 32)
    ref[3, 3] = out[3, 3] = float("nan")  # eager's own NaN: left out of every figure
    out[5, 5] += 0.5
    r = compare(ref, out)
    finite = torch.isfinite(ref)
    diff = (out - ref)[finite].abs().double()
    assert not r.ok and "max abs error 0.5" in r.reason
    assert r.max_abs_error == pytest.approx(float(diff.max()), rel=1e-12)
    a, b = ref[finite].double(), out[finite].double()
    cosine = float((a * b).sum() / (a.norm() * b.norm()))
    assert r.min_cosine == pytest.approx(cosine, rel=1e-12)
    assert compare(torch.empty(0, 3), torch.empty(0, 3)).ok


def _torch_figures(ref: torch.Tensor, out: torch.Tensor) -> tuple[float, float, float]:
    """max abs, max rel and cosine made with torch in float64, over the finite positions."""
    r, o = ref.double(), out.double()
    finite = torch.isfinite(r) & torch.isfinite(o)
    r, o = r[finite], o[finite]
    diff = (o - r).abs()
    scale = float(r.abs().max())
    max_rel = float((diff / r.abs().clamp_min(max(scale * 1e-3, 1e-12))).max())
    return float(diff.max()), max_rel, float((r * o).sum() / (r.norm() * o.norm()))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_the_figures_of_every_float_dtype_are_those_of_its_values_in_float64(
    dtype: torch.dtype,
) -> None:
    g = torch.Generator().manual_seed(1)
    ref = (torch.randn(4097, generator=g) * 3).to(dtype)
    out = (ref.double() + 1e-3 * torch.randn(4097, generator=g, dtype=torch.float64)).to(dtype)
    if dtype == torch.float16:  # subnormal halves and the largest one, converted exactly
        ref[:3] = out[:3] = torch.tensor([6e-8, -3e-5, 65504.0], dtype=dtype)
    r = compare(ref, out, reduced_precision=True)
    max_abs, max_rel, cosine = _torch_figures(ref, out)
    assert r.max_abs_error == pytest.approx(max_abs, rel=1e-12)
    assert r.max_rel_error == pytest.approx(max_rel, rel=1e-12)
    assert r.min_cosine == pytest.approx(cosine, rel=1e-9)
    bad = out.clone()
    bad[7] = float("inf")
    assert compare(ref, bad).reason.startswith("Inf outputs: output 0 has 1 Inf")


def test_each_part_of_a_complex_output_is_held_to_the_tolerance() -> None:
    g = torch.Generator().manual_seed(2)
    ref = torch.randn(64, dtype=torch.complex64, generator=g)
    assert compare(ref, ref + 1e-6).ok
    off = ref.clone()
    off[3] += 0.1j  # the imaginary part alone
    assert "max abs error 0.1" in compare(ref, off).reason


def test_lazily_conjugated_or_negated_outputs_are_compared_by_their_values() -> None:
    g = torch.Generator().manual_seed(3)
    z = torch.randn(32, dtype=torch.complex64, generator=g)
    assert compare(z.conj().resolve_conj(), z.conj()).ok  # conj(): a view with its bit set
    assert not compare(z, z.conj()).ok
    x = torch.randn(32, generator=g)
    assert compare(-x, torch._neg_view(x)).ok
    assert not compare(x, torch._neg_view(x)).ok


def test_zero_outputs_have_cosine_one_and_a_zero_against_values_fails() -> None:
    zeros = torch.zeros(16)
    assert compare(zeros, zeros.clone()).min_cosine == 1.0
    r = compare(zeros, torch.full((16,), 1e-3))
    assert r.min_cosine == 0.0 and not compare(zeros, torch.full((16,), 1e-3), True).ok


def test_integer_outputs_must_be_exact() -> None:
    a = torch.arange(10)
    assert compare(a, a.clone()).ok
    assert not compare(a, a + 1).ok


class _Layer:
    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys, self.values = keys, values


class _Cache:
    """Shaped like a transformers KV cache: an object pytree does not know, holding tensors."""

    def __init__(self, layers: list[_Layer]) -> None:
        self.layers = layers
        self._seen = object()  # private state differs between two equal caches


def test_an_object_holding_tensors_is_compared_by_its_tensors_not_its_identity() -> None:
    k, v = torch.randn(2, 4, 8), torch.randn(2, 4, 8)
    logits = torch.randn(2, 10)
    eager = (logits, _Cache([_Layer(k, v)]))
    same = (logits.clone(), _Cache([_Layer(k.clone(), v.clone())]))
    assert compare(eager, same).ok
    wrong = compare(eager, (logits.clone(), _Cache([_Layer(k.clone(), v + 1.0)])))
    assert not wrong.ok and "wrong outputs" in wrong.reason
    fewer = compare(eager, (logits.clone(), _Cache([])))
    assert not fewer.ok and "structure" in fewer.reason


def test_fp32_candidates_meet_tf32_tolerance_where_eager_runs_tf32() -> None:
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU())
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 4))
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    cudnn, matmul = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    precision = torch.get_float32_matmul_precision()
    try:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = True, False
        torch.set_float32_matmul_precision("highest")
        assert eager_tolerance(conv, cuda) == TF32  # cuDNN's default: TF32 convolutions
        assert eager_tolerance(mlp, cuda) is None  # fp32 matmuls: fp32's tolerance
        assert eager_tolerance(conv, cpu) is None
        torch.set_float32_matmul_precision("high")
        assert eager_tolerance(mlp, cuda) == TF32
        torch.set_float32_matmul_precision("highest")
        torch.backends.cudnn.allow_tf32 = False
        assert eager_tolerance(conv, cuda) is None
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = cudnn, matmul
        torch.set_float32_matmul_precision(precision)


def test_the_fp32_tolerance_applies_to_float32_outputs_only() -> None:
    torch.manual_seed(0)
    ref = torch.randn(64, 64)
    off = ref * (1 + 5e-3)  # TF32-sized error
    assert not compare(ref, off).ok
    assert compare(ref, off, fp32=TF32).ok
    # A bf16 output keeps the reduced-precision tolerance, looser than TF32's.
    half = ref.bfloat16()
    off_half = (ref * (1 + 2e-2)).bfloat16()
    assert compare(half, off_half).ok
    assert compare(half, off_half, fp32=TF32).ok


@pytest.mark.gpu
def test_a_cuda_output_is_judged_as_its_copy_on_the_cpu_would_be() -> None:
    torch.manual_seed(0)
    ref = torch.randn(128, 256)
    cases = [ref + 1e-6, ref * 1.01, ref.clone(), ref.clone()]
    cases[2][7, 9] = float("nan")
    cases[3][1, 1] = float("inf")
    for out in cases:
        on_cpu = compare(ref, out)
        on_gpu = compare(ref.cuda(), out.cuda())
        assert (on_gpu.ok, on_gpu.reason) == (on_cpu.ok, on_cpu.reason)
        assert on_gpu.max_abs_error == pytest.approx(on_cpu.max_abs_error, rel=1e-9)
        assert on_gpu.min_cosine == pytest.approx(on_cpu.min_cosine, rel=1e-9)
    ints = torch.arange(10, device="cuda")
    assert compare(ints, ints.clone()).ok and not compare(ints, ints + 1).ok


@pytest.mark.gpu
def test_comparing_cuda_outputs_runs_no_kernel_on_the_gpu() -> None:
    """Only copies to the host: a kernel's first launch in a process may wait for the whole
    device (CUDA loads kernels lazily), and a JIT program's calls wait with it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    on_gpu: list[str] = []

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            if any(t.is_cuda for t in tensors):
                host_copy = (
                    func is torch.ops.aten._to_copy.default
                    and kwargs.get("device") == torch.device("cpu")
                    and kwargs.get("dtype", args[0].dtype) == args[0].dtype
                )
                if not host_copy and func is not torch.ops.aten.detach.default:
                    on_gpu.append(str(func))
            return func(*args, **kwargs)

    ref = torch.randn(256, 256, device="cuda")
    ints = torch.arange(9, device="cuda")
    outs = (ref + 1e-6, ref * 1.01, ints.clone())
    with Ops():
        results = [compare(ref, outs[0]), compare(ref, outs[1]), compare(ints, outs[2])]
    assert [r.ok for r in results] == [True, False, True]
    assert on_gpu == []
