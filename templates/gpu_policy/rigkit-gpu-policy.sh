#!/bin/bash
# rigkit GPU policy: caps power and locks clocks on every GPU listed in the policy file.
# Installed by rigkit; run at boot by rigkit-gpu-policy.service and by deploys that change
# the policy. Usage: rigkit-gpu-policy [apply|reset] [POLICY_FILE]
#   apply  wait for every listed GPU, set persistence mode, re-apply each power limit only
#          where it differs, lock (or reset) clocks, set NVML clock offsets (0,0 for "default");
#          a GPU listed in PARKED is left unlocked: rigkit-ondemand released its lock while its
#          on-demand models are parked, and locks it again before one loads (rigside/parked_clocks.py)
#   reset  unlock clocks, zero clock offsets and restore each listed GPU's default power limit
# Every line goes to stdout, which systemd sends to the journal. Exits non-zero on any failure.
set -u -o pipefail

ACTION=${1:-apply}
POLICY=${2:-/etc/rigkit/gpu-policy.conf}
WAIT_S=${RIGKIT_GPU_WAIT_S:-120}   # how long GPUs may take to answer after boot
RETRY_S=2
EXIT_NO_PERMISSION=4               # nvidia-smi's "Insufficient Permissions"
OFFSETS_TOOL=${RIGKIT_GPU_OFFSETS_TOOL:-/usr/local/sbin/rigkit-gpu-offsets}
NVML_COPY_DIR=/usr/local/lib/rigkit/gpu-policy   # pynvml for rigs without nvidia-ml-py
NVSMI_S=${RIGKIT_NVSMI_S:-8}       # each nvidia-smi call's limit: a wedged driver hangs it
APPLIED_STAMP=/run/rigkit/gpu-policy.applied
# One writer of the GPUs' settings at a time: this script (a deploy, a boot) and the GPU keeper's
# repairs take the same lock. The keeper holds it while it decides and runs this script, and says so
# with RIGKIT_GPU_POLICY_LOCK_HELD=1; anyone else waits here for it.
POLICY_LOCK=/run/rigkit/gpu-keeper.lock
LOCK_WAIT_S=${RIGKIT_GPU_LOCK_WAIT_S:-150}   # longer than a keeper's repair may take (its 120 s apply bound)
PARKED=/run/rigkit/gpu-parked      # GPUs whose clock lock rigkit-ondemand released, an index a line
TIMED_OUT=124                      # timeout(1)'s exit status (137: it had to SIGKILL)

# nvidia-smi under a time limit: killed (nothing left running) and reported when it hangs.
nvsmi() { timeout -k 2 "$NVSMI_S" nvidia-smi "$@"; }

say() { echo "rigkit-gpu-policy: $*"; }
die() { say "FAILED: $*"; exit 1; }

# $1: exit code, $2: output, $3: what was being done
check() {
    if [[ $1 -eq $TIMED_OUT || $1 -eq 137 ]]; then
        die "$3: nvidia-smi did not answer within ${NVSMI_S} s (a wedged GPU or driver)"
    elif [[ $1 -eq $EXIT_NO_PERMISSION ]]; then
        die "$3: not permitted (nvidia-smi exit 4: ${2//$'\n'/ }). Run as root: the unit has no User= for this reason."
    elif [[ $1 -ne 0 ]]; then
        die "$3: nvidia-smi refused (exit $1): ${2//$'\n'/ }"
    fi
}

[[ -r $POLICY ]] || die "cannot read policy file $POLICY"
if [[ -z ${RIGKIT_GPU_POLICY_LOCK_HELD:-} ]]; then
    if mkdir -p "${POLICY_LOCK%/*}" 2>/dev/null && { exec 9>>"$POLICY_LOCK"; } 2>/dev/null; then
        flock -w "$LOCK_WAIT_S" 9 || die "the GPU keeper held $POLICY_LOCK for ${LOCK_WAIT_S} s (a repair that did not finish)"
    else  # not root: nothing it could change either, and nvidia-smi says so below in its own words
        say "cannot open $POLICY_LOCK (not root?); going on without it"
    fi
fi
# The policy read once: what is applied and the digest stamped are the same bytes, whatever a deploy
# writes to the file meanwhile (the keeper then sees the file differ from the stamp, and holds off).
SNAPSHOT=$(mktemp "${TMPDIR:-/tmp}/rigkit-gpu-policy.XXXXXX") || die "cannot make a temporary file"
trap 'rm -f "$SNAPSHOT"' EXIT
cp -- "$POLICY" "$SNAPSHOT" || die "cannot read policy file $POLICY"
declare -a INDEX LIMIT LOCK OFFSETS
while read -r index limit lock offsets _; do
    [[ -z $index || $index == \#* ]] && continue
    INDEX+=("$index"); LIMIT+=("$limit"); LOCK+=("$lock"); OFFSETS+=("${offsets:-default}")
done < "$SNAPSHOT"
(( ${#INDEX[@]} )) || die "no GPUs listed in $POLICY"

# Wait until every listed GPU answers: at boot the driver may not be ready yet.
declare -A CURRENT DEFAULT
deadline=$((SECONDS + WAIT_S))
attempt=0
while :; do
    attempt=$((attempt + 1))
    out=$(nvsmi --query-gpu=index,power.limit,power.default_limit --format=csv,noheader,nounits 2>&1)
    rc=$?
    [[ $rc -eq $EXIT_NO_PERMISSION || $rc -eq $TIMED_OUT || $rc -eq 137 ]] && check "$rc" "$out" "reading GPUs"
    missing=()
    if [[ $rc -eq 0 ]]; then
        CURRENT=(); DEFAULT=()
        while IFS=', ' read -r i limit default; do
            CURRENT[$i]=${limit%.*}; DEFAULT[$i]=${default%.*}
        done <<< "$out"
        for i in "${INDEX[@]}"; do [[ -n ${CURRENT[$i]:-} ]] || missing+=("$i"); done
        (( ${#missing[@]} == 0 )) && break
    fi
    if (( SECONDS >= deadline )); then
        die "GPU(s) ${missing[*]:-${INDEX[*]}} did not answer within ${WAIT_S} s (${attempt} attempts; last: exit $rc: ${out//$'\n'/ })"
    fi
    (( attempt == 1 )) && say "waiting up to ${WAIT_S} s for GPU(s) ${missing[*]:-${INDEX[*]}} (nvidia-smi: ${out//$'\n'/ })"
    sleep "$RETRY_S"
done
say "found GPU(s) ${INDEX[*]} after $attempt attempt(s)"

if [[ $ACTION == apply ]]; then
    out=$(nvsmi -pm 1 2>&1); rc=$?
    if [[ $rc -eq 0 ]]; then
        say "persistence mode enabled"
    else
        [[ $rc -eq $EXIT_NO_PERMISSION || $rc -eq $TIMED_OUT || $rc -eq 137 ]] && check "$rc" "$out" "enabling persistence mode"
        say "persistence mode not supported here, continuing (nvidia-smi exit $rc: ${out//$'\n'/ })"
    fi
fi

for n in "${!INDEX[@]}"; do
    i=${INDEX[$n]}
    want=${LIMIT[$n]}; lock=${LOCK[$n]}
    if [[ $ACTION == reset ]]; then
        want=default; lock=default
    fi
    [[ $want == default ]] && want=${DEFAULT[$i]}
    if [[ ${CURRENT[$i]} == "$want" ]]; then
        did="power limit ${CURRENT[$i]} W as wanted, left alone"
    else
        out=$(nvsmi -i "$i" -pl "$want" 2>&1); check $? "$out" "GPU $i: setting power limit $want W"
        did="power limit ${CURRENT[$i]} W -> $want W"
    fi
    if [[ $lock != default && $ACTION == apply ]] && grep -qx -- "$i" "$PARKED" 2>/dev/null; then
        out=$(nvsmi -i "$i" -rgc 2>&1); check $? "$out" "GPU $i: resetting clocks"
        did+="; clocks left unlocked: its on-demand models are parked (rigkit-ondemand locks them to $lock MHz before one loads)"
    elif [[ $lock == default ]]; then
        out=$(nvsmi -i "$i" -rgc 2>&1); check $? "$out" "GPU $i: resetting clocks"
        did+="; clocks unlocked"
    else
        out=$(nvsmi -i "$i" -lgc "$lock" 2>&1); check $? "$out" "GPU $i: locking clocks to $lock MHz"
        did+="; clocks locked to $lock MHz"
    fi
    offsets=${OFFSETS[$n]}
    [[ $ACTION == reset ]] && offsets=default
    if [[ -x $OFFSETS_TOOL ]]; then
        if python3 -c 'import pynvml' 2>/dev/null; then nvml_path=; else nvml_path=$NVML_COPY_DIR; fi
        if [[ $offsets == default ]]; then
            out=$(PYTHONPATH=$nvml_path timeout -k 2 "$NVSMI_S" "$OFFSETS_TOOL" "$i" 0 0 --if-supported 2>&1) || die "GPU $i: ${out//$'\n'/ }"
        else
            out=$(PYTHONPATH=$nvml_path timeout -k 2 "$NVSMI_S" "$OFFSETS_TOOL" "$i" "${offsets%,*}" "${offsets#*,}" 2>&1) || die "GPU $i: ${out//$'\n'/ }"
            did+="; clock offsets ${offsets} MHz (memory,graphics) read back"
        fi
    elif [[ $offsets != default ]]; then
        die "GPU $i: clock offsets $offsets asked for, but $OFFSETS_TOOL is not installed"
    fi
    say "GPU $i: $did"
done

# The policy file's digest as applied: the keeper (rigkit-gpu-keeper) holds off while the file
# differs from it (a deploy between writing a new policy and applying it).
mkdir -p "${APPLIED_STAMP%/*}"
if [[ $ACTION == apply ]]; then
    sha256sum < "$SNAPSHOT" | cut -d' ' -f1 > "$APPLIED_STAMP.tmp" && mv -f "$APPLIED_STAMP.tmp" "$APPLIED_STAMP"
    say "applied; a clock lock cannot be read back, verify under load"
else
    rm -f "$APPLIED_STAMP"
    say "reset: clocks unlocked and default power limits restored"
fi
