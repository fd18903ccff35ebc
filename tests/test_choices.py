"""What a run chooses by its device where the user chose nothing (bert_squad/choices.py): the padding and the
DeepSpeed config, each with its reason, for every kind of device whatever machine runs the test (a CPU's
features are its /proc/cpuinfo text, given here), and that the user's choice wins."""

import pytest

from bert_squad import choices

# /proc/cpuinfo as machines print it, cut to the lines the choice reads.
EPYC_ZEN4 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
EPYC_ZEN2 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 fma\n"
SAPPHIRE_RAPIDS = "flags\t\t: avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd fphp asimdhp sve bf16 i8mm\n"
GRAVITON2 = "processor\t: 0\nFeatures\t: fp asimd fphp asimdhp atomics\n"


CPUS = [(EPYC_ZEN4, True, False), (EPYC_ZEN2, False, False), (SAPPHIRE_RAPIDS, True, True), (GRAVITON3, True, True)]
CPUS += [(GRAVITON2, False, True), ("", False, False)]  # an Arm CPU with fp16 only; no /proc/cpuinfo at all


@pytest.mark.parametrize("cpuinfo, bf16, fp16", CPUS)
def test_which_cpus_compute_16_bits(cpuinfo, bf16, fp16):
    assert choices.cpu_computes("bf16", cpuinfo) is bf16 and choices.cpu_computes("fp16", cpuinfo) is fp16


def test_a_cpu_with_bf16_trains_in_ds_bf16_one_without_in_ds_fp32():
    with_bf16 = choices.precision(None, "cpu", gpu_bf16=False, cpuinfo=EPYC_ZEN4)
    assert with_bf16 == choices.Choice("ds_bf16", "this CPU computes bf16 (avx512_bf16)")
    assert (
        choices.precision(None, "cpu", False, SAPPHIRE_RAPIDS).why == "this CPU computes bf16 (amx_bf16, avx512_bf16)"
    )
    assert choices.precision(None, "cpu", False, GRAVITON3).value == "ds_bf16"
    for cpuinfo in (EPYC_ZEN2, GRAVITON2, ""):
        without = choices.precision(None, "cpu", gpu_bf16=False, cpuinfo=cpuinfo)
        assert without.value == "ds_fp32" and "no bf16" in without.why, without
    # fp16 is never the default, not even where the CPU computes it
    assert all(choices.precision(None, "cpu", False, c).value != "ds_fp16" for c in (SAPPHIRE_RAPIDS, GRAVITON2))


def test_a_gpu_trains_in_bf16_where_torch_says_it_has_it():
    assert choices.precision(None, "cuda", gpu_bf16=True, cpuinfo=EPYC_ZEN2) == choices.Choice(
        "ds_bf16", "this GPU computes bf16"
    )
    assert choices.precision(None, "cuda", gpu_bf16=False, cpuinfo=EPYC_ZEN4).value == "ds_fp32"


def test_a_named_config_wins_and_a_resumed_run_keeps_its_precision():
    for named in ("ds_fp32", "ds_fp16", "ds_zero2", "runs/x/deepspeed_config.json"):
        assert choices.precision(named, "cpu", False, EPYC_ZEN4, resumed="bf16") == choices.Choice(named, "given")
    # a run started on a CPU with bf16 resumes in bf16 where the default is fp32 (a GPU without, a CPU without)
    assert choices.precision(None, "cpu", False, EPYC_ZEN2, resumed="bf16").value == "ds_bf16"
    assert choices.precision(None, "cuda", False, "", resumed="bf16").value == "ds_bf16"
    assert choices.precision(None, "cpu", False, EPYC_ZEN4, resumed="fp32").value == "ds_fp32"
    assert choices.precision(None, "cuda", True, "", resumed="fp16").value == "ds_fp16"
    assert choices.precision(None, "cpu", False, EPYC_ZEN4, resumed="fp32").why == "kept from the checkpoint it resumes"


def test_fp16_on_a_cpu_without_fp16_says_what_it_costs():
    said = choices.cost("fp16", "cpu", EPYC_ZEN4)
    assert said.startswith("fp16 is emulated on this CPU") and "17x slower than fp32" in said
    assert choices.cost("fp16", "cpu", SAPPHIRE_RAPIDS) == choices.cost("fp16", "cuda", EPYC_ZEN4) == ""
    assert choices.cost("bf16", "cpu", EPYC_ZEN2) == ""  # bf16 is never chosen there, and named it is the user's


@pytest.mark.parametrize(
    "given, compiled, device, padding",
    [
        (None, False, "cpu", "longest"),  # a CPU's step time follows its tokens
        (None, True, "cpu", "buckets"),  # a compiled step: a graph a shape
        (None, True, "cuda", "buckets"),  # compiled and replayed as CUDA graphs
        (None, False, "cuda", "buckets"),  # a GPU keeps today's choice until measured
        ("buckets", False, "cpu", "buckets"),  # the user's wins
        ("max-length", True, "cuda", "max-length"),
        ("longest", True, "cpu", "longest"),
    ],
)
def test_padding_by_need(given, compiled, device, padding):
    chosen = choices.padding(given, compiled, device)
    assert chosen.value == padding
    assert (chosen.why == "given") == (given is not None)
    assert chosen.why == "given" or ("--compile" in chosen.why) == compiled


def test_this_machines_choice_follows_its_own_cpuinfo():
    """The rule applied to this machine's /proc/cpuinfo: whichever branch it takes, the one its features say."""
    cpuinfo = choices.this_cpuinfo()
    expected = "ds_bf16" if choices.cpu_computes("bf16", cpuinfo) else "ds_fp32"
    assert choices.precision(None, "cpu", False, cpuinfo).value == expected
