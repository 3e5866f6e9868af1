"""Nodes bench/spin.py calls inside a worker: torch work of the kinds a
pack's node does (importable there because spin.py puts this directory on
the worker's PYTHONPATH).  Each timed function returns its own seconds,
measured inside the worker, so the crossing is not in the figure."""

import time

import numpy as np
import torch

_m = np.random.default_rng(0).random((256, 256))


def shift(img):
    """A node: two parallel regions over an IMAGE, a new IMAGE back."""
    out = img * 0.5
    out.add_(0.25)
    return out


def blas_node(img):
    """A numpy node: a matrix product (OpenBLAS's threads), a new image back."""
    _m @ _m
    return img * 0.5


def numel(t):
    return t.numel()


def elementwise(reps):
    """Back-to-back parallel regions over 2 MiB (an elementwise node)."""
    x = torch.rand(1 << 19)
    y = torch.empty_like(x)
    t0 = time.perf_counter()
    for _ in range(reps):
        torch.mul(x, 2.0, out=y)
        y.add_(1.0)
        y.sum()
    return time.perf_counter() - t0


def matmul(reps):
    """Small matrix products (an MLP at batch 1)."""
    a = torch.randn(192, 192)
    t0 = time.perf_counter()
    for _ in range(reps):
        torch.mm(a, a)
    return time.perf_counter() - t0


def conv(reps):
    """3x3 convolutions over a 16 x 128 x 128 map (a small UNet block)."""
    b = torch.randn(1, 16, 128, 128)
    k = torch.randn(16, 16, 3, 3)
    t0 = time.perf_counter()
    for _ in range(reps):
        torch.nn.functional.conv2d(b, k, padding=1)
    return time.perf_counter() - t0


def gaps(reps, gap_us):
    """A parallel region, then gap_us of Python work, repeated (a sampler's
    loop with its bookkeeping between steps)."""
    x = torch.rand(1 << 19)
    y = torch.empty_like(x)
    t0 = time.perf_counter()
    for _ in range(reps):
        torch.mul(x, 2.0, out=y)
        end = time.perf_counter() + gap_us * 1e-6
        while time.perf_counter() < end:
            pass
    return time.perf_counter() - t0


def blas(reps, gap_us):
    """numpy matrix products with gap_us of Python work between them."""
    t0 = time.perf_counter()
    for _ in range(reps):
        _m @ _m
        end = time.perf_counter() + gap_us * 1e-6
        while time.perf_counter() < end:
            pass
    return time.perf_counter() - t0
