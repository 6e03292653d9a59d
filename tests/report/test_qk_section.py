"""The W_QK section: ranks and spectra read from the factors, checked against the formed matrix."""

from __future__ import annotations

import html
import re

import numpy as np
import torch

from headlab.models import headed
from headlab.report.sections.qk import QKSpectra, measure, plot_spectra, render_qk
from tests.support.tiny import tiny


def test_measure_reads_every_head_and_the_formed_matrix_agrees() -> None:
    model = tiny("bert")
    spectra = measure(model)
    sites = headed(model).sites
    assert spectra.d_model == 32 and spectra.d_head == [8, 8]
    assert [s.shape for s in spectra.singular] == [(4, 8), (4, 8)]
    assert all((r == 8).all() for r in spectra.ranks)
    with torch.no_grad():
        w = sites[1].W_Q[3].double() @ sites[1].W_K[3].double().T  # (d_model, d_model)
    np.testing.assert_allclose(spectra.singular[1][3], torch.linalg.svdvals(w).numpy()[:8], rtol=1e-5)
    assert spectra.dense_check.shape == (32,) and spectra.dense_check[8:].max() < 1e-5 * spectra.dense_check[0]


def test_effective_rank_counts_the_values_needed_for_the_energy() -> None:
    s = np.array([[3.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])  # energies 9+1+1+1 and 4 × 1
    spectra = QKSpectra(d_model=8, d_head=[4], n_kv_heads=[2], singular=[s], ranks=[np.array([4, 4])],
                        dense_check=np.ones(8))
    np.testing.assert_array_equal(spectra.effective_ranks(0.75)[0], [1, 3])
    np.testing.assert_array_equal(spectra.effective_ranks(0.9)[0], [3, 4])


def test_render_states_the_measured_numbers() -> None:
    spectra = measure(tiny("bert"))
    text = html.unescape(render_qk(spectra, name="tiny", plot_href="assets/qk.svg"))
    assert "every head's W_QK is a 32 × 32 matrix" in text and "All 8 heads reach that bound." in text
    assert "costs 512 parameters; as one full bilinear form per head it would cost 1,024, 2.0× as many" in text
    assert 'src="assets/qk.svg"' in text
    assert len(re.findall(r"<tr><td>\d</td>", text)) == 2
    svg = plot_spectra(spectra)
    assert svg == plot_spectra(spectra) and b"<svg" in svg


def test_a_grouped_query_head_pays_its_share_of_the_shared_key_factor() -> None:
    """Tiny Llama: 4 query heads, 2 key heads of d_head 8 over d_model 32: a query head owns its 256 query
    parameters and half of a key head's 256, 384 in all, not 512."""
    import headlab
    from headlab.models import HeadedModel
    from tests.support.tiny import build

    model = headlab.attach(build("llama", attn_implementation="sdpa")).model
    spectra = measure(HeadedModel(model=model, tokenizer=None, source="tiny llama"))
    assert spectra.n_kv_heads == [2, 2] and [len(r) for r in spectra.ranks] == [4, 4]
    assert spectra.factored_cost(0) == 32 * 8 + 32 * 8 / 2
    text = html.unescape(render_qk(spectra, name="tiny llama"))
    assert ("costs 384 parameters: its own 256-parameter query factor and a 1/2 share of the 256-parameter key "
            "factor that its key head serves to 2 query heads (grouped-query attention, 2 key heads for 4 query "
            "heads); as one full bilinear form per head it would cost 1,024, 2.7× as many") in text
