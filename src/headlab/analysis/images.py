"""``analyze_images``: the head analyses of a vision transformer on images, as ``analyze`` runs them on text.

One capture pass over the images (``headlab.capture.images.capture_images``) feeds ``PatchStats`` (entropy, the
distance attended on the patch grid, the share on [CLS] and the registers: ``headlab.analysis.patches``) and
``HeadSimilarity``; importance and the pruning curve then run their own passes. What only means something for text
is skipped with the reason on record: the text statistics and roles, pattern classes, syntax, the causal probes,
retrieval and streaming heads, value-weighted attention and the sink share by position.

A windowed model (Swin) is analysed layer by layer on each stage's grid (``headlab.models.images.PatchGrid.of``),
its distances in first-stage patches; it has no [CLS] nor any special token, so the share on them and the sink role
are skipped with that reason; head similarity compares its heads on the first stage's patches
(``headlab.capture.images.on_first_grid``).

Importance (Michel et al. 2019) needs a task with a gradient: an image and its mirror image are the pair a base
vision model should embed alike, as a sentence and its paraphrase are for a sentence encoder, so the loss is
``paraphrase_loss``'s in-batch contrastive loss on (image, mirrored image) pairs (``mirror_loss``; embeddings:
the last hidden states' mean over positions, L2-normalised). The pruning curve reads the embeddings' cosine to the
unpruned model's on the same images (``FIDELITY_METRIC``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from headlab.analysis.capture_pass import SIMILARITY_ROW_FRACTION
from headlab.analysis.patches import PatchStats, patch_roles
from headlab.analysis.result import AnalysisResult
from headlab.analysis.sentences import FIDELITY_METRIC
from headlab.analysis.similarity import HeadSimilarity, mds
from headlab.capture.images import ImageCorpus, capture_images, image_grid, on_first_grid
from headlab.heads.selection import HeadSelection
from headlab.models import HeadedModel, headed
from headlab.models.images import PIXELS

__all__ = ["QUICK_IMAGES", "SKIPPED", "analyze_images", "image_embed", "image_fidelity", "mirror_batches",
           "mirror_loss"]

QUICK_IMAGES = 60  # images analysed with quick=True (the first, in order), as 60 corpus items are for text
TASK_IMAGES = (16, 64)  # images of the importance task and the pruning curve: (quick, full)
TASK_BATCH = 8  # images per batch of the importance task (each batch's other images are its negatives)

# What ``analyze`` runs on text and not on images, and why (``AnalysisResult.skipped``).
SKIPPED = {
    "text statistics and roles": "to_prev, to_next, to_punct, to_sep and distance read a text's order, punctuation "
                                 "and separators; on images the statistics are patch_distance, to_cls, to_special, "
                                 "entropy (headlab.analysis.patches), the roles sink, broad and local",
    "pattern classes": "Kovaleva et al.'s classes read a text's diagonal and sentences; an image's patches lie on a "
                       "grid (patch_distance measures how far a head looks)",
    "syntax": "dependency relations are a text's; an image has none",
    "causal probes": "duplicate-token and induction probes need a causal text model",
    "retrieval and streaming heads": "both run on text (copied spans, the next-token loss)",
    "value-weighted attention and sink share by position": "their sink tokens and position bins are a text's; the "
                                                           "share on an image's special tokens is to_special",
}


def analyze_images(
    model: HeadedModel | nn.Module,
    images: Any,
    *,
    heads: HeadSelection = None,
    quick: bool = False,
    importance: bool = True,
    progress: bool = True,
) -> AnalysisResult:
    """Run the head analyses that mean something for images on a vision transformer.

    Args:
        model: an image model's handle with its image processor (``headlab.load`` of a checkpoint with
            preprocessor_config.json), or pixel values as ``images``.
        images: a folder of images, image files, PIL images, a list of them, or pixel values ``(batch, channels,
            height, width)`` (``headlab.capture.images.ImageCorpus``).
        heads: the heads of the capture pass (``PatchStats``, similarity); None for all.
        quick: the first ``QUICK_IMAGES`` images, a smaller importance task, no exact ablation.
        importance: run gradient importance (and, without ``quick``, exact ablation) and the pruning curve.
        progress: show the capture's progress bar.

    Returns:
        An ``AnalysisResult`` with ``grid`` set: ``surface`` is ``PatchStats``' table, ``roles`` ``patch_roles``;
        ``skipped`` holds ``SKIPPED`` and any part that could not run.

    Raises:
        TypeError: images without an image processor (the message names the file a checkpoint lacks).
        ValueError / OSError: bad images or selection; a model whose positions do not fit its grid.
    """
    handle = headed(model)
    corpus = ImageCorpus(handle, images)
    if quick:
        corpus = corpus.first(QUICK_IMAGES)
    grid = image_grid(handle, corpus.pixels([0]))
    patches, similarity = PatchStats(grid=grid), HeadSimilarity(row_fraction=SIMILARITY_ROW_FRACTION)
    run, _ = capture_images(handle, corpus, heads=heads, consumers=[patches, on_first_grid(grid, similarity)],
                            progress=progress)
    surface, similar = patches.result(), similarity.result()
    skipped = dict(SKIPPED)
    if not grid.n_special:
        skipped["to_cls, to_special and the sink role"] = (f"{handle.architecture} has no [CLS] nor any other special "
                                                           "token: every position is a patch")
    result = AnalysisResult(capture=run, surface=surface, roles=patch_roles(surface, grid), taxonomy=None, classes={},
                            similarity=similar, embedding=mds(similar.distances), skipped=skipped, grid=grid)
    if not importance:
        result.skipped["importance"] = "not asked for"
        return result
    n_task = TASK_IMAGES[0] if quick else TASK_IMAGES[1]
    pixels = corpus.pixels(range(min(n_task, len(corpus))))
    if len(pixels) < 2:
        result.skipped["importance"] = (f"{len(pixels)} image: the mirror task's contrastive loss needs at least 2 "
                                        "(each batch's other images are its negatives)")
        return result
    batches = mirror_batches(pixels, device=handle.device, dtype=handle.dtype)
    result.measure_importance(handle, batches, mirror_loss, {FIDELITY_METRIC: image_fidelity(handle, pixels)},
                              quick=quick)
    return result


def image_embed(net: nn.Module, pixels: Tensor) -> Tensor:
    """The images' embeddings: the last hidden states' mean over positions, L2-normalised; differentiable.

    Args:
        net: the model itself.
        pixels: ``(batch, channels, height, width)`` on its device.

    Returns:
        ``(batch, d_model)`` unit vectors.
    """
    hidden = net(**{PIXELS: pixels}).last_hidden_state  # (batch, pos, d_model)
    return F.normalize(hidden.mean(1), dim=-1)


def mirror_batches(pixels: Tensor, *, batch_size: int = TASK_BATCH, device: torch.device | str = "cpu",
                   dtype: torch.dtype = torch.float32) -> list[dict[str, Tensor]]:
    """Batches of (image, mirrored image) pairs for ``mirror_loss``: ``{"a": pixels, "b": pixels flipped left to
    right}``, each ``(batch, channels, height, width)`` on ``device``. A last batch of one image (no negative) joins
    the one before."""
    starts = list(range(0, len(pixels), batch_size))
    if len(starts) > 1 and len(pixels) - starts[-1] < 2:
        starts.pop()
    ends = [*starts[1:], len(pixels)]
    return [{"a": pixels[s:e].to(device=device, dtype=dtype), "b": pixels[s:e].flip(-1).to(device=device, dtype=dtype)}
            for s, e in zip(starts, ends)]


def mirror_loss(net: nn.Module, batch: dict[str, Tensor], *, scale: float = 20.0) -> Tensor:
    """In-batch contrastive loss of (image, mirrored image) pairs: cross-entropy of ``scale · cos(a_i, b_j)`` with
    each image's own mirror as the target and the batch's other mirrors as negatives (``paraphrase_loss`` on
    images: one vector for every image does not minimise it)."""
    a, b = image_embed(net, batch["a"]), image_embed(net, batch["b"])  # (batch, d_model) unit vectors
    scores = scale * a @ b.T  # (batch, batch)
    return F.cross_entropy(scores, torch.arange(len(scores), device=scores.device))


def image_fidelity(model: HeadedModel | nn.Module, pixels: Tensor, *,
                   batch_size: int = TASK_BATCH) -> Callable[[Any], float]:
    """A ``metric_fn``: the mean cosine of each image's embedding to the one the model gives it *now* (call this
    before masking anything: the unpruned reference).

    Args:
        model: the model's handle (or an attached model).
        pixels: ``(batch, channels, height, width)`` on the CPU.
        batch_size: images per forward.
    """
    def embeddings(current: Any) -> Tensor:
        handle = headed(current)
        with handle.running(grad=False) as net:
            return torch.cat([image_embed(net, pixels[s:s + batch_size].to(device=handle.device, dtype=handle.dtype))
                              for s in range(0, len(pixels), batch_size)])

    reference = embeddings(model)

    def fidelity(current: Any) -> float:
        return float((embeddings(current) * reference).sum(-1).mean())

    return fidelity
