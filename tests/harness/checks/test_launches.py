"""Launch counts (`harness/checks/launches.py`): exact on any machine, so a test can bound
what one decode step of the GPU code path launches (`benchmarks/bench_launches.py`)."""

from __future__ import annotations

import torch

from benchmarks.bench_launches import step_launches
from servelab.harness.checks.launches import count_launches
from servelab.models.dummy import DUMMY_SHAPES

CPU = torch.device("cpu")
# A decode step of the GPU code path: a few launches a layer, the step's metadata in one copy,
# one value read back (the sampled tokens).
LAYER_KERNELS, STEP_TRANSFERS, STEP_SYNCS = 12, 1, 1


def test_each_kind_is_counted_as_what_it_asks_of_the_device() -> None:
    x, w = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(8, 8, dtype=torch.bfloat16)
    with torch.inference_mode(), count_launches() as counts:
        y = (x @ w.t()).relu()  # t: a view; matmul and relu: two kernels
        y.view(-1).sum().item()  # view: none; sum: one; item: a sync
        y.add_(1)  # in place: one
        y.float()  # a conversion: one
        y.to(CPU)  # a transfer asked for by name (no data moves on the CPU)
        torch.tensor([1, 2], device=CPU)  # a tensor made on a device from host data
    assert (counts.operators, counts.syncs, counts.transfers, counts.triton) == (5, 1, 2, 0)
    assert counts.names["aten::matmul"] == 1 and counts.views >= 2


def test_work_on_host_data_named_as_such_is_the_hosts_and_no_sync() -> None:
    lens, x = torch.tensor([3, 5]), torch.randn(8)
    with torch.inference_mode(), count_launches(host=[lens]) as counts:
        int(lens.max() + 1)  # the host's own: two operators and a value read back
        x.index_select(0, lens).sum().item()  # device work on a host index: two and a sync
    assert (counts.host, counts.operators, counts.syncs) == (3, 2, 1)
    with torch.inference_mode(), count_launches() as counts:  # not named: all on the device
        int(lens.max() + 1)
    assert (counts.host, counts.operators, counts.syncs) == (0, 2, 1)


def test_a_triton_launch_counts_once_and_not_its_interpreted_insides() -> None:
    from servelab.kernels.int4_matmul_triton import GEMV_ROWS, int4_matmul_triton
    from tests.kernels.test_int4_kernels import random_int4

    qweight, qzeros, scales, _ = random_int4(64, 32, 32, seed=0)
    int4_matmul_triton(torch.randn(2, 64), qweight, qzeros, scales, 32)  # makes the counters
    for rows in (2, GEMV_ROWS + 1):  # the split-K GEMV, its sum in the same launch; the GEMM
        x = torch.randn(rows, 64)
        with torch.inference_mode(), count_launches() as counts:
            int4_matmul_triton(x, qweight, qzeros, scales, 32)
        assert counts.triton == 1 and counts.operators == 0, rows  # memory only


def test_a_decode_step_of_the_gpu_path_launches_a_few_kernels_a_layer() -> None:
    counted = step_launches(DUMMY_SHAPES["tiny"], 4, torch.float16, CPU, "triton")
    # four products (qkv, o, gate-up, down); two norms, rotary with the cache write, SiLU and
    # the product, decode attention's split and merge: six Triton kernels
    assert counted.per_layer.names == {"aten::linear": 4} and counted.per_layer.triton == 6
    assert counted.per_layer.kernels <= LAYER_KERNELS
    assert counted.step.transfers <= STEP_TRANSFERS and counted.step.syncs <= STEP_SYNCS


def test_the_int4_layers_launch_their_kernels_in_place_of_the_products() -> None:
    from servelab.kernels.int4_matmul_triton import GEMV_ROWS

    # each of the four products one launch: the split-K GEMV up to GEMV_ROWS rows, a GEMM beyond
    for batch in (4, GEMV_ROWS + 2):
        counted = step_launches(
            DUMMY_SHAPES["tiny"], batch, torch.float16, CPU, "triton", "vllm-awq"
        )
        assert not counted.per_layer.names and counted.per_layer.triton == 6 + 4
        assert counted.per_layer.kernels <= LAYER_KERNELS
        assert counted.step.transfers <= STEP_TRANSFERS and counted.step.syncs <= STEP_SYNCS
