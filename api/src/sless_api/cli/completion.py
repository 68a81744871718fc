"""Shell completion for ``sless`` (bash, zsh, fish), generated from its argparse tree so a new verb or flag
completes at once.

Each script holds the same table: for each command path (``sless``, ``sless trigger``, ...) the sub-verbs and
flags that may follow. Right after a verb that takes a function's name, the scripts also offer the tenant's
function names, asked of the API at that moment with ``sless ls -q`` (nothing when it cannot be reached).
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable

#: the command paths whose first argument is a function's name
FUNCTION_PATHS = frozenset({
    "sless get", "sless scale", "sless rm", "sless source", "sless logs", "sless invoke", "sless versions",
    "sless rollback", "sless traffic", "sless env", "sless env set", "sless env unset", "sless calls",
})  # fmt: skip

_BASH = r"""_sless() {
  local cur="${COMP_WORDS[COMP_CWORD]}" path=sless key w i last=0 names=""
  for ((i = 1; i < COMP_CWORD; i++)); do
    w="${COMP_WORDS[i]}"
    [[ $w == -* ]] && continue
    key="$path $w"
    if [[ -n "${_sless_words[$key]+set}" ]]; then path=$key; last=$i; fi
  done
  if [[ $cur != -* && -n "${_sless_functions[$path]+set}" ]] && ((last == COMP_CWORD - 1)); then
    names=$("${COMP_WORDS[0]}" ls -q 2>/dev/null)
  fi
  COMPREPLY=($(compgen -W "${_sless_words[$path]} $names" -- "$cur"))
}
complete -F _sless sless
"""

_ZSH = r"""_sless() {
  local cmdpath=sless key w i last=1
  local -a choices
  for ((i = 2; i < CURRENT; i++)); do
    w=${words[i]}
    [[ $w == -* ]] && continue
    key="$cmdpath $w"
    if (( ${+_sless_words[$key]} )); then cmdpath=$key; last=$i; fi
  done
  choices=(${=_sless_words[$cmdpath]})
  if [[ ${words[CURRENT]} != -* ]] && (( ${+_sless_functions[$cmdpath]} && last == CURRENT - 1 )); then
    choices+=(${(f)"$("${words[1]}" ls -q 2>/dev/null)"})
  fi
  compadd -a choices
}
compdef _sless sless
"""

_FISH = r"""function __sless_complete
    set -l tokens (commandline -opc)
    set -l cur (commandline -ct)
    set -l path sless
    set -l last 1
    set -l i 1
    while test $i -lt (count $tokens)
        set i (math $i + 1)
        set -l w $tokens[$i]
        string match -q -- '-*' $w; and continue
        if contains -- "$path $w" $__sless_paths
            set path "$path $w"
            set last $i
        end
    end
    __sless_words $path
    string match -q -- '-*' "$cur"; and return
    if contains -- $path $__sless_function_paths; and test $last -eq (count $tokens)
        $tokens[1] ls -q 2>/dev/null
    end
end
complete -c sless -f -a '(__sless_complete)'
"""


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its tree only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def words(parser: argparse.ArgumentParser, path: str = "sless") -> dict[str, list[str]]:
    """For each command path ("sless", "sless trigger", ...): the sub-verbs and flags that may follow. A verb whose
    sub-verbs are words of its own (``sless env set``, beside ``sless env NAME``) names them in its ``subverbs``
    default; a positional argument's fixed choices (``sless completion bash``) are offered too."""
    children = _subparsers(parser)
    flags = [opt for action in parser._actions for opt in action.option_strings if opt.startswith("--")]
    own: list[str] = parser.get_default("subverbs") or []
    choices = [str(choice) for action in parser._actions if not action.option_strings and action.choices
               and not isinstance(action, argparse._SubParsersAction) for choice in action.choices]
    table = {path: [*children, *own, *choices, *flags]}
    for name in own:
        table[f"{path} {name}"] = flags
    for name, child in children.items():
        table.update(words(child, f"{path} {name}"))
    return table


def _function_paths(table: dict[str, list[str]]) -> list[str]:
    return sorted(FUNCTION_PATHS & set(table))


def bash_script(root: argparse.ArgumentParser) -> str:
    table = words(root)
    entries = " ".join(f"[{shlex.quote(path)}]={shlex.quote(' '.join(choices))}"
                       for path, choices in sorted(table.items()))
    functions = " ".join(f"[{shlex.quote(path)}]=1" for path in _function_paths(table))
    return f"declare -gA _sless_words=({entries})\ndeclare -gA _sless_functions=({functions})\n{_BASH}"


def zsh_script(root: argparse.ArgumentParser) -> str:
    """For ``source <(sless completion zsh)`` after ``compinit`` (``compdef`` comes with it)."""
    table = words(root)
    entries = " ".join(f"{shlex.quote(path)} {shlex.quote(' '.join(choices))}"
                       for path, choices in sorted(table.items()))
    functions = " ".join(f"{shlex.quote(path)} 1" for path in _function_paths(table))
    return (f"typeset -gA _sless_words _sless_functions\n_sless_words=({entries})\n"
            f"_sless_functions=({functions})\n{_ZSH}")


def _fish_quote(text: str) -> str:
    """TEXT as one fish word: single quotes, with fish's two escapes inside them (backslash and quote)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def fish_script(root: argparse.ArgumentParser) -> str:
    """For ``sless completion fish | source`` (or saved as ``~/.config/fish/completions/sless.fish``)."""
    table = words(root)
    cases = "".join(f"        case {_fish_quote(path)}\n            printf '%s\\n' "
                    f"{' '.join(_fish_quote(c) for c in choices)}\n" for path, choices in sorted(table.items())
                    if choices)
    return (f"set -g __sless_paths {' '.join(_fish_quote(p) for p in sorted(table))}\n"
            f"set -g __sless_function_paths {' '.join(_fish_quote(p) for p in _function_paths(table))}\n"
            f"function __sless_words\n    switch $argv[1]\n{cases}    end\nend\n{_FISH}")


#: each shell's script, by the name ``sless completion SHELL`` takes
SCRIPTS: dict[str, Callable[[argparse.ArgumentParser], str]] = {
    "bash": bash_script, "zsh": zsh_script, "fish": fish_script,
}
