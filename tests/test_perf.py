"""The FLOP accounting behind MFU and the table of peak FLOP/s it divides by."""

from bert_squad.perf import flops_per_sample, model_shape, peak_tflops


def test_bert_base_flops_per_sample_at_384():
    from transformers import BertConfig, BertForQuestionAnswering

    gflop = flops_per_sample(model_shape(BertForQuestionAnswering(BertConfig())), 384) / 1e9
    assert 205 < gflop < 220  # the published figure: about 212 GFLOP per 384-token sample


def test_peak_table():
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989
    assert peak_tflops("NVIDIA H100 PCIe", "bf16") == 756
    assert peak_tflops("AMD Instinct MI250X", "fp16") == 191.5
    assert peak_tflops("cpu", "fp32") is None and peak_tflops("cpu", "fp32", override=1.5) == 1.5
