#!/bin/bash
# bert-squad training job, site "{{site}}": {{description}}
# Rendered by `{{command}}` from bert_squad/cluster/job_template.sh and sites.json: change those, not this.
# Usage, from the repository root:  sbatch [sbatch options] <this script> [training arguments]
# With no training arguments the site defaults below run. Environment knobs: BERT_SQUAD_RUNTIME
# (ce|pyxis|sarus|singularity|apptainer|charliecloud|none), BERT_SQUAD_IMAGE, BERT_SQUAD_EDF (ce: your own
# EDF instead of the one the job writes), BERT_SQUAD_LAUNCHER (mpirun|srun), BERT_SQUAD_REQUEUE (1: requeue
# after a checkpointed stop), BERT_SQUAD_SCRATCH, BERT_SQUAD_WORK, BERT_SQUAD_CACHE, BERT_SQUAD_RUNTIME_FLAGS
# (extra runtime options, e.g. --nv), BERT_SQUAD_REPO.
{{sbatch}}
set -euo pipefail

# >>> inputs: `bert-squad launch --submit` runs this part on the submit host too, so what it refuses is
# refused before sbatch, by the same lines that refuse it here.
die() { echo "bert-squad: error: $*" >&2; exit 2; }
# sbatch runs a spooled copy of this file, so the checkout is found from the submit directory.
export BERT_SQUAD_REPO=${BERT_SQUAD_REPO:-${SLURM_SUBMIT_DIR:-$PWD}}
RUNTIME=${BERT_SQUAD_RUNTIME:-{{runtime}}}
LAUNCHER=${BERT_SQUAD_LAUNCHER:-{{launcher}}}
REQUEUE=${BERT_SQUAD_REQUEUE:-{{requeue}}}
case "$REQUEUE" in 0|1) ;; *) die "BERT_SQUAD_REQUEUE=$REQUEUE: use 1 (requeue after a checkpointed stop) or 0" ;; esac
SCRATCH_DIR=${BERT_SQUAD_SCRATCH:-{{scratch}}}
export BERT_SQUAD_WORK=${BERT_SQUAD_WORK:-$SCRATCH_DIR/bert-squad}
IMAGE=${BERT_SQUAD_IMAGE:-{{image}}}
# Compute nodes are offline: everything comes from the cache that --download-only filled on a login node.
export BERT_SQUAD_CACHE=${BERT_SQUAD_CACHE:-$BERT_SQUAD_WORK/cache}
# Bind the scratch, the checkout and the cache, each once (a path under another is already visible).
MOUNTS=()
for dir in "$SCRATCH_DIR" "$BERT_SQUAD_REPO" "$BERT_SQUAD_CACHE"; do
  dir=$(realpath -m "$dir")
  covered=0
  for m in "${MOUNTS[@]}"; do
    case "$dir/" in "$m"/*) covered=1 ;; esac
  done
  [ "$covered" = 1 ] || MOUNTS+=("$dir")
done
# What a container cannot start without, said in one line before any rank starts.
check_inputs() {
  case "$RUNTIME" in
    ce|pyxis)
      [ "$LAUNCHER" = srun ] || die "BERT_SQUAD_RUNTIME=$RUNTIME starts the containers through srun: use BERT_SQUAD_LAUNCHER=srun"
      if [ "$RUNTIME" = ce ] && [ -n "${BERT_SQUAD_EDF:-}" ]; then
        [ -f "$BERT_SQUAD_EDF" ] || die "BERT_SQUAD_EDF=$BERT_SQUAD_EDF: no such file (an EDF, CSCS's Environment Definition File)"
        return 0  # the EDF names the image and the mounts
      fi ;;
    charliecloud) ;;
    *) return 0 ;;
  esac
  [ -n "$IMAGE" ] || die "set BERT_SQUAD_IMAGE to the image (a SquashFS file, or a registry reference for ce and pyxis)"
  # A path (/... or ./...) is a local image; anything else is a registry reference that Enroot pulls.
  if [[ $IMAGE == /* || $IMAGE == ./* || $RUNTIME == charliecloud ]]; then
    [[ -f $IMAGE || -d $IMAGE ]] || die "image $IMAGE is absent: build or import it first (containers/README.md)"
    check_image_arch
  fi
  for m in "${MOUNTS[@]}"; do
    [ -d "$m" ] || die "mount source $m does not exist: create it or point BERT_SQUAD_SCRATCH/BERT_SQUAD_CACHE elsewhere"
  done
}
# A SquashFS image's CPU architecture, from the ELF header of its /usr/bin/env (unknown: no check).
check_image_arch() {
  local arch={{arch}} machine found
  [ -n "$arch" ] && [ -f "$IMAGE" ] && command -v unsquashfs >/dev/null || return 0
  machine=$(unsquashfs -cat "$IMAGE" usr/bin/env 2>/dev/null | od -An -tu2 -j18 -N2 | tr -d ' ') || true
  case "$machine" in 183) found=aarch64 ;; 62) found=x86_64 ;; *) return 0 ;; esac
  [ "$found" = "$arch" ] || die "image $IMAGE is built for $found, a {{site}} node runs $arch: build it on (or for) $arch (containers/README.md)"
}
# <<< inputs
check_inputs
cd "$BERT_SQUAD_REPO"
[ -d bert_squad ] || die "$BERT_SQUAD_REPO has no bert_squad/: submit from the repository root or set BERT_SQUAD_REPO"
[ -n "${SLURM_JOB_ID:-}" ] || die "not inside a Slurm job: submit with sbatch, or run it inside salloc"

{{modules}}
{{site_env}}
export HF_HOME=$BERT_SQUAD_CACHE/hf HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# What the ranks must see in a container even where its image sets its own (ce: the EDF's [env], pyxis:
# --container-env; the other runtimes pass the environment through).
CONTAINER_ENV=(HF_HOME HF_HUB_OFFLINE HF_DATASETS_OFFLINE TRANSFORMERS_OFFLINE)
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1} PYTHONUNBUFFERED=1
# The variable each rank narrows to its own GPU (empty: none, or Slurm binds one GPU to each task itself).
export BERT_SQUAD_GPU_ENV={{gpu_env}}
# The collectives' network the site configures (ofi: the libfabric plugin); a rank that finds NCCL/RCCL
# on sockets instead says so in its log (bert_squad/transport.py).
export BERT_SQUAD_NETWORK={{network}}
CPU_BIND={{cpu_bind}}

if [ "$#" -gt 0 ]; then
  TRAIN_ARGS=("$@")
else
  TRAIN_ARGS=({{train_args}})
fi
# What the ranks run before the training arguments (empty: training itself), and what the cache check adds
# to them (a sweep's: its directory, as the output dir it proves writable).
RANK_COMMAND=({{rank_command}})
CHECK_ARGS=({{check_args}})

# The site's runtime options unless BERT_SQUAD_RUNTIME_FLAGS is set (set it empty for none).
SITE_RUNTIME_FLAGS={{runtime_flags}}
read -ra RUNTIME_FLAGS <<< "${BERT_SQUAD_RUNTIME_FLAGS-$SITE_RUNTIME_FLAGS}"
# The CSCS Container Engine's EDF for this job (the EDF reference: cscs-docs docs/software/container-engine/edf.md),
# written whole or not at all.
toml() { local s=${1//\\/\\\\}; printf '"%s"' "${s//\"/\\\"}"; }  # a TOML basic string
write_edf() {
  local m sep=""
  mkdir -p "$(dirname "$1")"
  {
    echo "# bert-squad job ${SLURM_JOB_ID}, site {{site}}: the environment its ranks run in (srun --environment)"
    echo "image = $(toml "$IMAGE")"
    printf 'mounts = ['
    for m in "${MOUNTS[@]}"; do printf '%s%s' "$sep" "$(toml "$m:$m")"; sep=", "; done
    echo "]"
    echo "workdir = $(toml "$BERT_SQUAD_REPO")"
    echo "[env]"
    for m in "${CONTAINER_ENV[@]}"; do echo "$m = $(toml "${!m}")"; done
    cat <<'SITE_EDF'
{{edf}}
SITE_EDF
  } > "$1.tmp.$$"
  mv "$1.tmp.$$" "$1"
}
# Runtimes that wrap each rank's command (RUN), or that are options of srun itself (CONTAINER).
CONTAINER=()
case "$RUNTIME" in
  ce)
    EDF=${BERT_SQUAD_EDF:-$BERT_SQUAD_WORK/edf/job-$SLURM_JOB_ID.toml}
    [ -n "${BERT_SQUAD_EDF:-}" ] || write_edf "$EDF"
    CONTAINER=("--environment=$EDF" "${RUNTIME_FLAGS[@]}")
    RUN=() ;;
  pyxis)
    # srun keeps the last of a repeated --container-mounts or --container-env: the runtime flags' join ours.
    binds=() names=("${CONTAINER_ENV[@]}") others=()
    for m in "${MOUNTS[@]}"; do binds+=("$m:$m"); done
    for f in "${RUNTIME_FLAGS[@]}"; do
      case "$f" in
        --container-mounts=*) binds+=("${f#*=}") ;;
        --container-env=*) names+=("${f#*=}") ;;
        *) others+=("$f") ;;
      esac
    done
    CONTAINER=("--container-image=$IMAGE" "--container-workdir=$BERT_SQUAD_REPO"
               "--container-mounts=$(IFS=,; echo "${binds[*]}")" "--container-env=$(IFS=,; echo "${names[*]}")"
               "${others[@]}")
    RUN=() ;;
  sarus)
    command -v sarus >/dev/null || die "sarus is not on PATH (module load sarus)"
    ref=$IMAGE
    [[ ${ref##*/} == *:* ]] || ref=$ref:latest
    sarus images | awk 'NR > 1 { print $1 ":" $2 }' | grep -qxF -e "$ref" -e "library/$ref" \
      || die "Sarus image '$IMAGE' is absent: sarus load or sarus pull it first (containers/README.md)"
    RUN=(sarus run)
    for m in "${MOUNTS[@]}"; do RUN+=("--mount=type=bind,source=$m,destination=$m"); done
    RUN+=("${RUNTIME_FLAGS[@]}" "$IMAGE") ;;
  singularity|apptainer)
    command -v "$RUNTIME" >/dev/null || die "$RUNTIME is not on PATH"
    [ -n "$IMAGE" ] || die "set BERT_SQUAD_IMAGE to the .sif image"
    [[ $IMAGE == *://* || -f $IMAGE ]] || die "image $IMAGE is absent: build or copy the .sif first (containers/README.md)"
    RUN=("$RUNTIME" exec)
    for m in "${MOUNTS[@]}"; do RUN+=(-B "$m:$m"); done
    RUN+=("${RUNTIME_FLAGS[@]}" "$IMAGE") ;;
  charliecloud)
    command -v ch-run >/dev/null || die "ch-run is not on PATH (module load charliecloud)"
    export USER=${USER:-$(id -un)}  # ch-run refuses to start without it
    RUN=(ch-run)
    for m in "${MOUNTS[@]}"; do RUN+=(-b "$m:$m"); done
    RUN+=("${RUNTIME_FLAGS[@]}")
    # ch-run binds only onto paths the image has (the host's /tmp is bound at /tmp), /etc/hosts included:
    # try it once here, and that the ranks can resolve the master (else the rendezvous waits forever).
    nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST")
    out=$("${RUN[@]}" "$IMAGE" -- true 2>&1) || die "ch-run cannot start $IMAGE with these binds (a bind destination must exist in the image): ${out//$'\n'/; }"
    # The image's ENV (ch-image keeps it in /ch/environment), as Sarus and Singularity apply theirs.
    if "${RUN[@]}" "$IMAGE" -- test -f /ch/environment; then RUN+=(--set-env); fi
    RUN+=("$IMAGE" --)
    "${RUN[@]}" getent hosts "${nodes%%$'\n'*}" >/dev/null \
      || die "${nodes%%$'\n'*} does not resolve inside $IMAGE: the image needs an /etc/hosts file (ch-run binds the host's onto it)"
    # With a SquashFS image ch-run stays the FUSE server and is not the rank: USR1, sent to the whole
    # process group, would kill it. Inherited as ignored, it reaches only python, whose handler replaces that.
    RUN=(bash -c 'trap "" USR1; exec "$@"' ch-run-ignoring-usr1 "${RUN[@]}") ;;
  none) RUN=() ;;
  *) die "BERT_SQUAD_RUNTIME=$RUNTIME: use ce, pyxis, sarus, singularity, apptainer, charliecloud or none" ;;
esac

# Fail here, in seconds, rather than in every rank after the containers started: the package itself
# says whether the run's model and dataset are in the cache (one definition of its layout).
# With ce and pyxis the container comes with a job step, on the batch shell's node.
ONCE=("${RUN[@]}")
[ "${#CONTAINER[@]}" = 0 ] || ONCE=(srun --ntasks=1 --nodes=1 "${CONTAINER[@]}")
# Its error line alone, without the launcher's own ("srun: error: ... Exited with exit code 2").
# shellcheck disable=SC2016  # expanded inside the container
if ! out=$("${ONCE[@]}" bash -c 'cd "$BERT_SQUAD_REPO" && exec python -m bert_squad check-cache "$@" >/dev/null' \
    check-cache "${TRAIN_ARGS[@]}" "${CHECK_ARGS[@]}" 2>&1); then
  grep '^bert-squad' <<< "$out" >&2 || echo "$out" >&2
  exit 2
fi

# Each rank, inside the container: its place from the launcher's variables, then its own GPU.
# shellcheck disable=SC2016  # expanded by the ranks, not here
RANK_SH='export RANK=${OMPI_COMM_WORLD_RANK:-$SLURM_PROCID} LOCAL_RANK=${OMPI_COMM_WORLD_LOCAL_RANK:-$SLURM_LOCALID} WORLD_SIZE=${OMPI_COMM_WORLD_SIZE:-$SLURM_NTASKS}
if [ -n "$BERT_SQUAD_GPU_ENV" ]; then
  IFS=, read -ra gpus <<< "${!BERT_SQUAD_GPU_ENV:-}"
  export "$BERT_SQUAD_GPU_ENV=${gpus[LOCAL_RANK]:-$LOCAL_RANK}"
fi
cd "$BERT_SQUAD_REPO" && exec python -m bert_squad "$@"'

case "$LAUNCHER" in
  # Open MPI under Slurm starts its daemons with srun, so the ranks inherit this shell's environment.
  # No binding: each rank runs OMP_NUM_THREADS threads.
  mpirun) LAUNCH=(mpirun -np "$SLURM_NTASKS" --bind-to none) ;;
  # Since Slurm 22.05 srun no longer inherits --cpus-per-task from the allocation.
  srun)
    LAUNCH=(srun --ntasks="$SLURM_NTASKS" --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" "${CONTAINER[@]}")
    [ -z "$CPU_BIND" ] || LAUNCH+=("--cpu-bind=$CPU_BIND") ;;
  *) die "BERT_SQUAD_LAUNCHER=$LAUNCHER: use mpirun or srun" ;;
esac
CMD=("${LAUNCH[@]}" "${RUN[@]}" bash -c "$RANK_SH" bert-squad-rank "${RANK_COMMAND[@]}" "${TRAIN_ARGS[@]}")

# Rendezvous: every rank derives MASTER_ADDR (first host of SLURM_JOB_NODELIST) and MASTER_PORT (from
# the job id, so two jobs sharing a node don't collide) itself, in bert_squad.distributed.detect.
echo "bert-squad: job $SLURM_JOB_ID, ${SLURM_JOB_NUM_NODES:-1} node(s), $SLURM_NTASKS rank(s), nodes $SLURM_JOB_NODELIST"
echo "bert-squad: runtime $RUNTIME${IMAGE:+ image $IMAGE}${EDF:+ environment $EDF}, launcher $LAUNCHER, cache $BERT_SQUAD_CACHE"
printf 'bert-squad: training arguments:'; printf ' %q' "${TRAIN_ARGS[@]}"; echo
printf 'bert-squad: running:'; printf ' %q' "${CMD[@]}"; echo

# Slurm's end-of-job warning (--signal=B:USR1@...) reaches only this shell: pass it to the launcher,
# which forwards it to the ranks; they checkpoint at the next step and exit with 75.
# shellcheck disable=SC2317  # called by the trap
forward() {
  echo "bert-squad: $1 received, asking the ranks to checkpoint and stop" >&2
  kill "-$1" "$LAUNCH_PID" 2>/dev/null || true
}
trap 'forward USR1' USR1
# Slurm's TERM (scancel, preemption, a node lost) reaches every process of the job, the ranks included;
# this shell only says which of the job's nodes stopped answering, so a lost node is named in the log.
# shellcheck disable=SC2317  # called by the trap
lost_nodes() {
  local lost
  lost=$(sinfo -h -N -n "$SLURM_JOB_NODELIST" -t down,fail,no_respond -o %N 2>/dev/null | sort -u | paste -sd, -)
  echo "bert-squad: TERM received; ${lost:+node(s) of this job not responding: $lost}${lost:-every node of this job responds}" >&2
}
trap lost_nodes TERM
"${CMD[@]}" &
LAUNCH_PID=$!
while :; do
  status=0
  wait "$LAUNCH_PID" || status=$?
  # A trap interrupts `wait` while the launcher still runs: wait again.
  kill -0 "$LAUNCH_PID" 2>/dev/null || break
done
if [ "$status" = 75 ]; then
  if [ "$REQUEUE" = 1 ]; then
    echo "bert-squad: stopped at a checkpoint; requeueing job $SLURM_JOB_ID to resume"
    scontrol requeue "$SLURM_JOB_ID"
  else
    echo "bert-squad: stopped at a checkpoint; resubmit with --resume auto and the same --output-dir to continue"
  fi
fi
exit "$status"
