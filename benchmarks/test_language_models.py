"""Transformer language models (GPT-2-small-like and a smaller one, bf16 autocast, AdamW), alone and collocated,
and a language model beside small ResNets. Part of the full matrix (--colloc-full)."""
import pytest

from pytest_gpucolloc import Workload

pytestmark = pytest.mark.gpucolloc_full

MODELS = {"gpt2-small": (8, 1024), "gpt-mini": (16, 512)}  # batch, sequence length


@pytest.mark.parametrize("n", [1, 2, 4], ids=lambda n: f"n{n}")
@pytest.mark.parametrize("model", sorted(MODELS))
def test_language_model(collocate, model, n):
    batch, seq_len = MODELS[model]
    collocate([Workload(model, batch_size=batch, precision="bf16", options={"seq_len": seq_len})] * n)


@pytest.mark.parametrize("small", [2, 4], ids=lambda k: f"{k}xresnet26")
def test_language_model_beside_small_resnets(collocate, small):
    collocate([Workload("gpt-mini", batch_size=16, precision="bf16", options={"seq_len": 512})]
              + [Workload("resnet26-cifar10", batch_size=128)] * small)
