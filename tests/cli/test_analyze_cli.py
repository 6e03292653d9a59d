"""``headlab analyze`` on the command line."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from headlab.cli import app


def test_json_rows_and_files(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The cat sat on the mat.\n\nHeads attend to different words.\nA third line, short.\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["analyze", "--text", str(corpus), "--out", str(out), "--quick",
                                      "--no-importance", "--no-syntax", "--no-streaming", "--layers", "0,1", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert len(document["heads"]) == 24 and document["summary"]["items"] == 3
    assert (out / "heads.csv").exists() and (out / "mds.png").exists() and not (out / "pruning.png").exists()
    assert (out / "sinks.png").exists() and not (out / "streaming.png").exists()
    said = document["summary"]["skipped"]["retrieval and streaming heads"]
    assert said.startswith("off: pass --streaming") and "the report runs them in its own section" in said


def test_table_output(tmp_path):
    result = CliRunner().invoke(app, ["analyze", "--quick", "--no-importance", "--out", str(tmp_path), "--layers",
                                      "0"])
    assert result.exit_code == 0, result.output
    assert "Heads by role" in result.output and "Pattern classes" in result.output
    said = " ".join(result.output.split())
    assert "Attention on the sink tokens: raw vs value-weighted" in said and "Streaming heads" not in said
    assert "skipped" in result.output and "causal probes" in result.output


def test_a_saved_tiny_gpt2_checkpoint_directory(tmp_path):
    """A user's own causal checkpoint: the command loads the directory, runs the causal probes
    (shortened to fit its 48 positions), retrieval and streaming heads, and next-token importance."""
    from tests.support.tiny import save_causal_checkpoint

    checkpoint = save_causal_checkpoint(tmp_path / "tiny-gpt2", n_positions=48)
    corpus = tmp_path / "corpus.txt"
    words = "the cat sat on a big red mat and the dog ran".split()  # enough text for the copies and the windows
    corpus.write_text("".join(" ".join(words[i % 5: i % 5 + 3 + i % 7]) + "\n" for i in range(40)))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["analyze", str(checkpoint), "--text", str(corpus), "--out", str(out),
                                      "--quick", "--no-syntax", "--streaming", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert len(document["heads"]) == 8  # 2 layers × 4 heads
    assert {"induction", "duplicate_token"} <= set(document["probes"])
    assert document["probes"]["induction"]["length"] == 23  # (48 - 1) // 2
    assert "causal probes" not in document["summary"]["skipped"]
    assert (out / "heads.json").exists() and (out / "pruning.png").exists() and (out / "streaming.png").exists()
    context = document["context"]  # shrunk to the 48 positions: 1 + 2 × 8 needle tokens leave 31
    assert context["haystack_length"] == 31 and len(context["retrieval"]["rows"]) == 8
    assert context["streaming"]["windows"] == [4, 16] and context["streaming"]["length"] == 48
    tables = CliRunner().invoke(app, ["analyze", str(checkpoint), "--text", str(corpus), "--out", str(out),
                                      "--quick", "--no-syntax", "--no-importance", "--streaming"])
    assert tables.exit_code == 0, tables.output
    said = " ".join(tables.output.split())
    assert "Retrieval heads (Wu et al. 2024): top 8 of 8" in said and "Streaming heads: 4 sink tokens" in said
    assert "key/value cache" in said and "on the first 4 positions" in said


def test_streaming_runs_the_selected_heads_and_max_length_cuts_items_and_sets_the_length(tmp_path):
    from tests.support.tiny import save_causal_checkpoint

    checkpoint = save_causal_checkpoint(tmp_path / "tiny-gpt2", n_positions=48)
    corpus = tmp_path / "corpus.txt"
    words = "the cat sat on a big red mat and the dog ran".split()
    corpus.write_text("".join(" ".join(words[i % 5: i % 5 + 3 + i % 7]) + "\n" for i in range(40)))
    result = CliRunner().invoke(app, ["analyze", str(checkpoint), "--text", str(corpus), "--out", str(tmp_path / "o"),
                                      "--quick", "--no-syntax", "--no-importance", "--streaming", "--layers", "1",
                                      "--heads", "0,1", "--max-length", "32", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    context = document["context"]
    assert [(r["layer"], r["head"]) for r in context["retrieval"]["rows"]] == [(1, 0), (1, 1)]
    assert [(r["layer"], r["head"]) for r in context["streaming"]["rows"]] == [(1, 0), (1, 1)]
    assert context["streaming"]["length"] == 32 and context["haystack_length"] == 32 - 1 - 2 * 8
    assert document["summary"]["truncated"] == 0 and len(document["heads"]) == 2  # items of at most 13 words
    short = CliRunner().invoke(app, ["analyze", str(checkpoint), "--text", str(corpus), "--out", str(tmp_path / "p"),
                                     "--quick", "--no-syntax", "--no-importance", "--streaming", "--max-length", "8"])
    assert short.exit_code == 2 and "cannot hold a needle of 8 tokens" in short.output, short.output


def test_an_architecture_headlab_cannot_serve_is_one_line_with_the_reason(tmp_path):
    import transformers

    for name, config in (("deberta", transformers.DebertaV2Config(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                                                  num_attention_heads=4, intermediate_size=64,
                                                                  architectures=["DebertaV2Model"])),
                         ("bloom", transformers.BloomConfig(vocab_size=100, hidden_size=32, n_layer=1, n_head=4,
                                                            architectures=["BloomForCausalLM"]))):
        config.save_pretrained(tmp_path / name)
        (tmp_path / name / "model.safetensors").write_bytes(b"never read")
        for command in (["analyze", str(tmp_path / name), "--out", str(tmp_path / "out")],
                        ["view", str(tmp_path / name), "the cat", "--out", str(tmp_path / "v.html")]):
            result = CliRunner().invoke(app, command)
            assert result.exit_code == 2 and "Traceback" not in result.output, result.output
            said = " ".join(result.output.split())  # the console wraps long lines
            assert said.startswith("error: ") and len(said) < 400
            assert "outside transformers' AttentionInterface" in said


def test_help_names_the_ray_extra_as_pip_takes_it():
    """Rich reads "[ray]" as markup unless escaped: the help must still print the extra's name."""
    result = CliRunner().invoke(app, ["analyze", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "pip install headlab[ray]" in " ".join(result.output.replace("│", " ").split())


def test_max_pattern_memory_takes_a_size_and_refuses_anything_else_in_one_line(tmp_path):
    from tests.support.tiny import save_causal_checkpoint

    checkpoint = save_causal_checkpoint(tmp_path / "tiny-gpt2", n_positions=48)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on a big red mat\nand the dog ran\n")
    for bad in ("lots", "0", "-1MiB", "3 parsecs"):
        refused = CliRunner().invoke(app, ["analyze", str(checkpoint), "--text", str(corpus), "--max-pattern-memory",
                                           bad, "--out", str(tmp_path / "o")])
        assert refused.exit_code == 2 and f"{bad!r} is not a size" in " ".join(refused.output.split()), refused.output
    ran = CliRunner().invoke(app, ["analyze", str(checkpoint), "--text", str(corpus), "--out", str(tmp_path / "o"),
                                   "--quick", "--no-syntax", "--no-importance", "--max-pattern-memory", "2KiB",
                                   "--json"])
    assert ran.exit_code == 0, ran.output
    summary = json.loads(ran.stdout)["summary"]
    assert summary["pattern_memory"] == 2048 and summary["blocked_batches"] >= 1
    assert "row blocks" in summary["skipped"]["pattern classes"]
