"""#49: a GGUF that stores a sentencepiece BPE vocabulary without merges (llama.cpp's ``llama`` tokenizer: pieces,
scores, types; Gemma 3's) is rebuilt as a BPE whose merges follow the pieces' scores, as sentencepiece's BPE
merges. transformers 4.57 reads Gemma 3's as a Unigram model and splits words into letters ("The capital of France
is" into 10 tokens where Gemma's own tokenizer makes 5), so the converted model read noise. The GGUFs here are
written with the ``gguf`` package: tokenizer fields only, no tensors."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("gguf")

NORMAL, CONTROL, USER_DEFINED, BYTE = 1, 3, 4, 6


def _write_vocabulary(path: Path, pieces: list[tuple[str, float, int]], *, add_space_prefix: bool = False) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch="gemma3")
    writer.add_tokenizer_model("llama")
    writer.add_token_list([piece for piece, _, _ in pieces])
    writer.add_token_scores([score for _, score, _ in pieces])
    writer.add_token_types([kind for _, _, kind in pieces])
    names = [piece for piece, _, _ in pieces]
    writer.add_bos_token_id(names.index("<bos>"))
    writer.add_eos_token_id(names.index("<eos>"))
    writer.add_unk_token_id(names.index("<unk>"))
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(add_space_prefix)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _vocabulary(ab_score: float, bc_score: float) -> list[tuple[str, float, int]]:
    return [("<pad>", 0.0, CONTROL), ("<eos>", 0.0, CONTROL), ("<bos>", 0.0, CONTROL), ("<unk>", 0.0, CONTROL),
            ("<0x21>", 0.0, BYTE), ("  ", 0.0, USER_DEFINED),
            ("▁", -1.0, NORMAL), ("a", -2.0, NORMAL), ("b", -3.0, NORMAL), ("c", -4.0, NORMAL),
            ("ab", ab_score, NORMAL), ("bc", bc_score, NORMAL), ("▁a", -5.0, NORMAL), ("▁ab", -6.0, NORMAL)]


def _tokens(path: Path, text: str) -> list[str]:
    from enginesmith.core.checkpoints.gguf import sentencepiece_bpe_tokenizer

    tokenizer = sentencepiece_bpe_tokenizer(path)
    assert tokenizer is not None
    return list(tokenizer.encode(text).tokens)  # type: ignore[attr-defined]


def test_merges_follow_the_joined_pieces_scores(tmp_path):
    ab_first = _write_vocabulary(tmp_path / "ab.gguf", _vocabulary(ab_score=-8.0, bc_score=-9.0))
    bc_first = _write_vocabulary(tmp_path / "bc.gguf", _vocabulary(ab_score=-9.0, bc_score=-8.0))
    # "abc" can be "ab"+"c" or "a"+"bc": the pair whose joined piece scores higher wins (a Unigram reading, or
    # merges in vocabulary order, would not follow the scores).
    assert _tokens(ab_first, "abc") == ["<bos>", "ab", "c"]
    assert _tokens(bc_first, "abc") == ["<bos>", "a", "bc"]
    assert _tokens(bc_first, "abab") == ["<bos>", "ab", "ab"]


def test_spaces_become_the_word_marker_and_special_and_user_pieces_stay_whole(tmp_path):
    from enginesmith.core.checkpoints.gguf import sentencepiece_bpe_tokenizer

    path = _write_vocabulary(tmp_path / "v.gguf", _vocabulary(ab_score=-8.0, bc_score=-9.0))
    assert _tokens(path, "c ab<eos>") == ["<bos>", "c", "▁ab", "<eos>"]
    assert _tokens(path, "a  b") == ["<bos>", "a", "  ", "b"]  # a whitespace run the vocabulary holds
    assert _tokens(path, "a!") == ["<bos>", "a", "<0x21>"]  # a character outside the vocabulary: its bytes
    tokenizer = sentencepiece_bpe_tokenizer(path)
    ids = tokenizer.encode("c ab!").ids  # type: ignore[attr-defined]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "c ab!"  # type: ignore[attr-defined]
    prefixed = _write_vocabulary(tmp_path / "p.gguf", _vocabulary(-8.0, -9.0), add_space_prefix=True)
    assert _tokens(prefixed, "ab") == ["<bos>", "▁ab"]


def test_a_vocabulary_with_merges_or_another_model_is_left_to_transformers(tmp_path):
    import gguf

    from enginesmith.core.checkpoints.gguf import sentencepiece_bpe_tokenizer

    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b", "ab"])
    writer.add_token_merges(["a b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert sentencepiece_bpe_tokenizer(path) is None


def test_the_conversion_replaces_only_a_tokenizer_transformers_read_as_another_model(tmp_path):
    """What transformers read is kept when it read a BPE; a Unigram reading of the same vocabulary is replaced by the
    rebuilt BPE, with the loaded tokenizer's special tokens."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from enginesmith.core.checkpoints.gguf import _rebuilt_tokenizer

    path = _write_vocabulary(tmp_path / "v.gguf", _vocabulary(ab_score=-8.0, bc_score=-9.0))
    pieces = [(piece, score) for piece, score, _ in _vocabulary(-8.0, -9.0)]
    as_unigram = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.Unigram(pieces, unk_id=3)),
                                         bos_token="<bos>", eos_token="<eos>", unk_token="<unk>")
    as_bpe = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), bos_token="<bos>")
    assert _rebuilt_tokenizer(path, as_bpe) is as_bpe
    rebuilt = _rebuilt_tokenizer(path, as_unigram)
    assert type(rebuilt.backend_tokenizer.model).__name__ == "BPE"
    assert rebuilt.tokenize("abc") == ["ab", "c"] and rebuilt.eos_token == "<eos>"


def test_a_conversion_parses_its_gguf_once_whoever_reads_it(tmp_path, monkeypatch):
    """transformers' loaders and ours each open the GGUF (six parses of Gemma 3's 262k-token vocabulary were two
    thirds of its conversion): inside ``each_gguf_parsed_once`` they share one parse, and outside it each is new."""
    import gguf
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from enginesmith.core.checkpoints.gguf import each_gguf_parsed_once, sentencepiece_bpe_tokenizer

    parses: list[str] = []

    class CountingReader(gguf.GGUFReader):
        def __init__(self, path, mode="r"):
            parses.append(str(path))
            super().__init__(path, mode)

    monkeypatch.setattr(gguf, "GGUFReader", CountingReader)
    path = _write_vocabulary(tmp_path / "v.gguf", _vocabulary(ab_score=-8.0, bc_score=-9.0))
    with each_gguf_parsed_once():
        tokenizer = sentencepiece_bpe_tokenizer(path)
        load_gguf_checkpoint(str(path))
        again = sentencepiece_bpe_tokenizer(tmp_path / "." / "v.gguf")
    assert parses == [str(path)]
    assert gguf.GGUFReader is CountingReader
    assert tokenizer.encode("abc").tokens == again.encode("abc").tokens
    sentencepiece_bpe_tokenizer(path)
    assert len(parses) == 2
