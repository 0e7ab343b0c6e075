#!/usr/bin/env bash
# Remove ANVE for the current user: the worker service, the menu entry and icon, the
# `anve` / `anve-worker` commands and the virtual environment. The history database,
# the converted models and the worker's tokens are kept unless --purge is given.
# (install.sh also copies this script to <data dir>/venv/share/anve/uninstall.sh.)
set -euo pipefail

APP_ID="org.anve.Desktop"
UNIT="anve-worker.service"
MARKER="# written by the ANVE installer"

usage() {
    cat <<'EOF'
usage: uninstall.sh [--purge]

Removes ANVE's program files for the current user: the worker service, the menu entry
and icon, the anve and anve-worker commands, and the virtual environment.
Keeps the chat history, the models and the worker's tokens, and says where they are.

  --purge      also delete the history database, the models and the tokens
  -h, --help   this help
EOF
}

say() { printf '==> %s\n' "$*"; }
note() { printf '    %s\n' "$*"; }
die() {
    printf 'uninstall.sh: error: %s\n' "$*" >&2
    exit 1
}

purge=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --purge) purge=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; die "unknown option: $1" ;;
    esac
done
[[ -n "${HOME:-}" && -d "$HOME" ]] || die "HOME is not set to an existing folder"

data_home="${XDG_DATA_HOME:-$HOME/.local/share}"
config_home="${XDG_CONFIG_HOME:-$HOME/.config}"
bin_dir="$HOME/.local/bin"
data_dir="$data_home/anve"
venv="$data_dir/venv"
conf_dir="$config_home/anve"
unit_dir="$config_home/systemd/user"
desktop_file="$data_home/applications/$APP_ID.desktop"
icon_root="$data_home/icons/hicolor"

removed=0
remove() { # remove PATH...: delete what exists, saying so
    local path
    for path in "$@"; do
        if [[ -e "$path" || -L "$path" ]]; then
            rm -rf -- "$path"
            note "removed $path"
            removed=$((removed + 1))
        fi
    done
}
ours() { grep -qsF "$MARKER" "$1"; }

say "uninstalling ANVE for $(id -un)"

if [[ -f "$unit_dir/$UNIT" || -L "$unit_dir/default.target.wants/$UNIT" ]]; then
    say "removing the worker service $UNIT"
    if command -v systemctl >/dev/null 2>&1 && systemctl --user show-environment >/dev/null 2>&1; then
        systemctl --user disable --now "$UNIT" >/dev/null 2>&1 || true
    fi
    remove "$unit_dir/default.target.wants/$UNIT"
    rmdir "$unit_dir/default.target.wants" 2>/dev/null || true
    if [[ -f "$unit_dir/$UNIT" ]] && ! ours "$unit_dir/$UNIT"; then
        note "kept $unit_dir/$UNIT: not written by the installer"
    else
        remove "$unit_dir/$UNIT"
    fi
    if command -v systemctl >/dev/null 2>&1 && systemctl --user show-environment >/dev/null 2>&1; then
        systemctl --user daemon-reload || true
        systemctl --user reset-failed "$UNIT" >/dev/null 2>&1 || true
    fi
fi

say "removing the menu entry, the icon and the commands"
remove "$desktop_file"
if command -v update-desktop-database >/dev/null 2>&1 && [[ -d "$(dirname "$desktop_file")" ]]; then
    update-desktop-database -q "$(dirname "$desktop_file")" 2>/dev/null || true
fi
for icon in "$icon_root"/*/apps/"$APP_ID".png "$icon_root"/*/apps/"$APP_ID".svg; do
    remove "$icon"
done
for dir in "$icon_root"/*/apps; do # the size folders the installer made, if now empty
    if [[ -d "$dir" ]]; then rmdir "$dir" "$(dirname "$dir")" 2>/dev/null || true; fi
done
for cmd in anve anve-worker; do
    if [[ -e "$bin_dir/$cmd" || -L "$bin_dir/$cmd" ]]; then
        if ours "$bin_dir/$cmd"; then
            remove "$bin_dir/$cmd"
        else
            note "kept $bin_dir/$cmd: not written by the installer"
        fi
    fi
done

say "removing the program files"
remove "$venv" "${XDG_CACHE_HOME:-$HOME/.cache}/anve/kernels"
rmdir "${XDG_CACHE_HOME:-$HOME/.cache}/anve" 2>/dev/null || true

if [[ $purge -eq 1 ]]; then
    say "purging the history, the models and the settings (--purge)"
    remove "$data_dir" "$conf_dir"
else
    kept=()
    for f in "$data_dir"/*.sqlite3 "$data_dir"/*.db; do
        if [[ -f "$f" ]]; then kept+=("history: $f"); fi
    done
    if [[ -d "$data_dir/models" ]]; then
        kept+=("models: $data_dir/models ($(du -sh "$data_dir/models" | cut -f1))")
    fi
    if [[ -d "$conf_dir" ]]; then
        kept+=("settings and worker tokens: $conf_dir")
    fi
    if [[ -d "$data_dir" ]] && [[ -z "$(ls -A "$data_dir")" ]]; then
        rmdir "$data_dir"
    fi
    if [[ ${#kept[@]} -gt 0 ]]; then
        say "kept (run again with --purge to delete them too):"
        for k in "${kept[@]}"; do note "$k"; done
    elif [[ -d "$data_dir" ]]; then
        say "kept $data_dir (run again with --purge to delete it)"
    fi
fi

if [[ $removed -eq 0 ]]; then
    say "nothing of ANVE was installed for $(id -un)"
else
    say "ANVE is uninstalled"
fi
