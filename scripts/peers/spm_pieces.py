"""Raw text to sentencepiece pieces and back, one line per line, with one sentencepiece model.

    python spm_pieces.py encode MODEL < raw.txt > pieces.txt      # "▁Hello ▁world ."
    python spm_pieces.py decode MODEL < pieces.txt > text.txt     # "Hello world."

What a user of a peer toolkit runs around its translate command to get nmt's interface (raw text
in, detokenised text out): scripts/decode_compare.py times both together with the translate
command. Needs only sentencepiece, which every peer's virtualenv has.
"""

import sys

import sentencepiece as spm


def main() -> None:
    mode, model = sys.argv[1], sys.argv[2]
    if mode not in ("encode", "decode"):
        raise SystemExit(f"spm_pieces.py: mode {mode!r}: expected encode or decode")
    sp = spm.SentencePieceProcessor(model_file=model)
    lines = sys.stdin.buffer.read().decode("utf-8").split("\n")  # only \n ends a line
    if lines[-1] == "":  # the final newline ends the last line; it opens none
        lines.pop()
    if mode == "encode":
        out = [" ".join(pieces) for pieces in sp.encode(lines, out_type=str)]
    else:
        out = [sp.decode_pieces(line.split()) for line in lines]
    sys.stdout.buffer.write("".join(f"{line}\n" for line in out).encode("utf-8"))


if __name__ == "__main__":
    main()
