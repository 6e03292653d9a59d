"""What the tests share; the one package a test imports from besides the library (tests/test_layout.py).

- ``tiny``: tiny random transformers models of every architecture headlab serves or refuses, a
  pruned BERT, loaded BERT / GPT-2 models with a tokenizer, a saved checkpoint folder.
- ``text``: words, sentences and tokenizers built in memory.
- ``minilm``: the packaged MiniLM, loaded once per session.
- ``reference``: what headlab is compared with (the layer head by head in float64, a model's heads
  from transformers' own outputs, patterns straight from a capture).
- ``layers``: small attention modules for the audit's error paths (also audited as a file by the CLI).
- ``analysis``, ``audit``, ``bench``, ``browser``: hand-made inputs, expected verdicts and helpers those
  rooms' tests share.
- ``devices``: the devices tests run on.
- ``docs``, ``regenerate``: Markdown's generated regions and Python blocks, and the functions that
  write the generated regions (``make readme``, ``make docs``, ``make bench``).
"""
