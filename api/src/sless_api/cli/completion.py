"""Shell completion for ``sless``, generated from its argparse tree so a new verb or flag completes at once."""

from __future__ import annotations

import argparse
import shlex

_FUNCTION = r"""_sless() {
  local cur="${COMP_WORDS[COMP_CWORD]}" path=sless key w i
  for ((i = 1; i < COMP_CWORD; i++)); do
    w="${COMP_WORDS[i]}"
    [[ $w == -* ]] && continue
    key="$path $w"
    [[ -n "${_sless_words[$key]+set}" ]] && path=$key
  done
  COMPREPLY=($(compgen -W "${_sless_words[$path]}" -- "$cur"))
}
complete -F _sless sless
"""


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its tree only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def words(parser: argparse.ArgumentParser, path: str = "sless") -> dict[str, list[str]]:
    """For each command path ("sless", "sless trigger", ...): the sub-verbs and flags that may follow."""
    children = _subparsers(parser)
    flags = [opt for action in parser._actions for opt in action.option_strings if opt.startswith("--")]
    table = {path: [*children, *flags]}
    for name, child in children.items():
        table.update(words(child, f"{path} {name}"))
    return table


def bash_script(root: argparse.ArgumentParser) -> str:
    entries = " ".join(f"[{shlex.quote(path)}]={shlex.quote(' '.join(choices))}"
                       for path, choices in sorted(words(root).items()))
    return f"declare -gA _sless_words=({entries})\n{_FUNCTION}"
