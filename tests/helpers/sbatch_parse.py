"""How sbatch reads ``#SBATCH`` lines: a port of ``_get_argument``/``_opt_batch_script`` (Slurm src/sbatch/opt.c,
22.05), so tests can assert what Slurm would see without a cluster. Works on bytes, as the C code does:
only ASCII whitespace separates words, quotes group, a backslash escapes the next byte (even inside
quotes), an unquoted ``#`` ends the line. Nothing is expanded."""
from __future__ import annotations

from typing import Dict, List

_SPACE = b" \t\n\v\f\r"


def sbatch_words(line: str) -> List[str]:
    """The argv words sbatch takes from one ``#SBATCH`` line (the text after the magic word)."""
    data, i, words = line.encode("utf-8"), 0, []
    while True:
        while i < len(data) and data[i] in _SPACE:
            i += 1
        word, quote, escaped = bytearray(), 0, False
        while i < len(data) and (quote or data[i] not in _SPACE):
            byte = data[i]
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped, i = True, i + 1
                continue
            elif quote:
                if byte == quote:
                    quote, i = 0, i + 1
                    continue
            elif byte in b"'\"":
                quote, i = byte, i + 1
                continue
            elif byte == 0x23:  # '#': the rest is a comment
                break
            word.append(byte)
            i += 1
        if quote:
            raise ValueError(f"sbatch: unmatched {chr(quote)} in {line!r}")
        if not word:  # sbatch stops reading the line at the first empty argument
            return words
        words.append(word.decode("utf-8"))


def sbatch_options(script: str) -> Dict[str, object]:
    """``{option: value}`` (True for a bare flag) from a script's leading ``#SBATCH`` lines."""
    options: Dict[str, object] = {}
    for line in script.splitlines()[1:]:
        if line.startswith("#SBATCH"):
            for word in sbatch_words(line[len("#SBATCH"):]):
                key, eq, value = word.partition("=")
                options[key.lstrip("-")] = value if eq else True
        elif line.strip() and not line.startswith("#"):
            break  # sbatch stops at the first command
    return options
