"""What a run chooses by its device where the user chose nothing (bert_squad/choices.py): the padding and the
DeepSpeed config, each with its reason, for every kind of device whatever machine runs the test (a CPU's
features are its /proc/cpuinfo text and its bf16 speed a function, both given here), and that the user's choice
wins."""

import pytest

from bert_squad import choices

# /proc/cpuinfo as machines print it, cut to the lines the choice reads.
EPYC_ZEN4 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
EPYC_ZEN2 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 fma\n"
SAPPHIRE_RAPIDS = "flags\t\t: avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd fphp asimdhp sve bf16 i8mm\n"
GRAVITON2 = "processor\t: 0\nFeatures\t: fp asimd fphp asimdhp atomics\n"


def speed(ratio):
    """A CPU's timed bf16 speed over fp32's (`perf.bf16_speedup` on a real one)."""
    return lambda: ratio


def untimed():
    raise AssertionError("timed where the choice needs no timing")


FAST, SLOW = speed(1.58), speed(0.57)  # an AMD EPYC (Zen 4) and an Intel Xeon without AMX, both with avx512_bf16

CPUS = [(EPYC_ZEN4, True, False), (EPYC_ZEN2, False, False), (SAPPHIRE_RAPIDS, True, True), (GRAVITON3, True, True)]
CPUS += [(GRAVITON2, False, True), ("", False, False)]  # an Arm CPU with fp16 only; no /proc/cpuinfo at all


@pytest.mark.parametrize("cpuinfo, bf16, fp16", CPUS)
def test_which_cpus_compute_16_bits(cpuinfo, bf16, fp16):
    assert choices.cpu_computes("bf16", cpuinfo) is bf16 and choices.cpu_computes("fp16", cpuinfo) is fp16


def test_a_cpu_trains_in_bf16_where_it_computes_it_faster_than_fp32():
    fast = choices.precision(None, "cpu", False, EPYC_ZEN4, FAST)
    assert fast == choices.Choice(
        "ds_bf16", "this CPU computes bf16 (avx512_bf16), 1.58x fp32's speed in a timed matmul"
    )
    assert choices.precision(None, "cpu", False, SAPPHIRE_RAPIDS, FAST).why.startswith(
        "this CPU computes bf16 (amx_bf16, avx512_bf16), "
    )
    assert choices.precision(None, "cpu", False, GRAVITON3, speed(1.2)).value == "ds_bf16"
    # the flags without the speed: bf16 slower than fp32 on this CPU, which trains in fp32 and says why
    slow = choices.precision(None, "cpu", False, EPYC_ZEN4, SLOW)
    assert slow == choices.Choice(
        "ds_fp32", "this CPU computes bf16 (avx512_bf16) but at 0.57x fp32's speed in a timed matmul"
    )
    assert choices.precision(None, "cpu", False, SAPPHIRE_RAPIDS, speed(1.0)).value == "ds_fp32"  # no faster
    for cpuinfo in (EPYC_ZEN2, GRAVITON2, ""):  # no bf16 arithmetic: fp32, and nothing timed
        without = choices.precision(None, "cpu", False, cpuinfo, untimed)
        assert without.value == "ds_fp32" and "no bf16" in without.why, without
    # fp16 is never the default, not even where the CPU computes it
    assert all(
        choices.precision(None, "cpu", False, c, s).value != "ds_fp16"
        for c in (SAPPHIRE_RAPIDS, GRAVITON2)
        for s in (FAST, SLOW)
    )


def test_a_gpu_trains_in_bf16_where_torch_says_it_has_it():
    assert choices.precision(None, "cuda", True, EPYC_ZEN2, untimed) == choices.Choice(
        "ds_bf16", "this GPU computes bf16"
    )
    assert choices.precision(None, "cuda", False, EPYC_ZEN4, untimed).value == "ds_fp32"


def test_a_named_config_wins_and_a_resumed_run_keeps_its_precision():
    """Neither times the CPU."""
    for named in ("ds_fp32", "ds_fp16", "ds_zero2", "runs/x/deepspeed_config.json"):
        assert choices.precision(named, "cpu", False, EPYC_ZEN4, untimed, resumed="bf16") == choices.Choice(
            named, "given"
        )
    # a run started on a CPU with bf16 resumes in bf16 where the default is fp32 (a GPU without, a CPU without)
    assert choices.precision(None, "cpu", False, EPYC_ZEN2, untimed, resumed="bf16").value == "ds_bf16"
    assert choices.precision(None, "cuda", False, "", untimed, resumed="bf16").value == "ds_bf16"
    assert choices.precision(None, "cpu", False, EPYC_ZEN4, untimed, resumed="fp32").value == "ds_fp32"
    assert choices.precision(None, "cuda", True, "", untimed, resumed="fp16").value == "ds_fp16"
    kept = choices.precision(None, "cpu", False, EPYC_ZEN4, untimed, resumed="fp32")
    assert kept.why == "kept from the checkpoint it resumes"


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


def test_this_machines_choice_follows_its_own_cpuinfo_and_timing():
    """The rule applied to this machine: its /proc/cpuinfo, and where that says bf16, its own timed matmul
    (`perf.bf16_speedup`: a real ratio, positive and finite)."""
    from bert_squad import perf

    cpuinfo, timed = choices.this_cpuinfo(), []

    def timing():
        timed.append(perf.bf16_speedup())
        return timed[-1]

    chosen = choices.precision(None, "cpu", False, cpuinfo, timing)
    if not choices.cpu_computes("bf16", cpuinfo):
        assert chosen.value == "ds_fp32" and timed == []
    else:
        assert len(timed) == 1 and 0 < timed[0] < 100, timed
        assert chosen.value == ("ds_bf16" if timed[0] > 1 else "ds_fp32")
        assert f"{timed[0]:.2f}x fp32's speed" in chosen.why
