"""The probe of ``attach`` observes headlab's attention function in its own context only: transformers'
registration stays as it is, and another thread running a model at the same time records nothing."""

from __future__ import annotations

import threading

import torch

import headlab
from headlab.models.interface import IMPLEMENTATION, attention
from headlab.models.probe import probe_inputs, recording
from tests.support.tiny import built


def test_recording_leaves_the_registration_and_other_threads_alone():
    from transformers import AttentionInterface

    model = headlab.attach(built("llama")).model
    inputs = probe_inputs(model)
    with torch.no_grad(), recording(model) as alone:
        model(**inputs)
    with torch.no_grad(), recording(model) as calls:
        assert AttentionInterface()[IMPLEMENTATION] is attention  # never swapped for a recorder
        worker = threading.Thread(target=lambda: model(**inputs))
        worker.start()
        worker.join()
        assert calls == []  # the other thread's forward ran headlab's attention, unobserved
        model(**inputs)
    n_layers = model.config.num_hidden_layers
    assert len(calls) == n_layers and [c.module for c in calls] == [s.module for s in headlab.attach(model).sites]
    # The projections around each call are those of the forward recorded alone: none of the other thread's.
    assert [(len(c.before), len(c.after)) for c in calls] == [(len(c.before), len(c.after)) for c in alone]
    assert len(alone[0].before) == 3  # layer 0's q, k and v projections


def test_attaching_in_two_threads_at_once_gives_each_model_its_own_sites():
    models = {name: built(name) for name in ("bert", "gpt2")}
    handles = {}
    barrier = threading.Barrier(2)

    def attach(name):
        barrier.wait()
        handles[name] = headlab.attach(models[name])

    threads = [threading.Thread(target=attach, args=(name,)) for name in models]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name, model in models.items():
        sites = handles[name].sites
        assert all(any(site.module is m for m in model.modules()) for site in sites)
        assert len(sites) == model.config.num_hidden_layers
