#!/bin/bash
# The shared part of every bert-squad job. slurm/<site>.sbatch holds a site's #SBATCH lines and environment and
# ends by sourcing this file, which then: checks the inputs (1), sets up the container runtime and checks the
# cache inside the image (2), builds each rank's command (3), and runs it with the end-of-job signal forwarded
# and a requeue after a checkpointed stop (4). Each container runtime's launch is one branch of the marked
# `case "$RUNTIME"` in part 2.
# The knobs, from the site script or the environment at sbatch time (sbatch passes it all to the job):
#   BERT_SQUAD_RUNTIME   ce | pyxis | sarus | singularity | apptainer | charliecloud | uenv | none
#   BERT_SQUAD_IMAGE     the image (a SquashFS or .sif file, or a registry reference for ce and pyxis)
#   BERT_SQUAD_EDF       ce: the EDF (CSCS's Environment Definition File) the ranks run in
#   BERT_SQUAD_LAUNCHER  srun | mpirun          BERT_SQUAD_REQUEUE  1: requeue after a checkpointed stop
#   BERT_SQUAD_SCRATCH, BERT_SQUAD_WORK, BERT_SQUAD_CACHE: where runs and the offline cache live
#   BERT_SQUAD_RUNTIME_FLAGS  extra runtime options (e.g. --nv)   BERT_SQUAD_ARCH  the nodes' CPU (image check)
#   BERT_SQUAD_GPU_ENV   the variable each rank narrows to its own GPU   BERT_SQUAD_CPU_BIND  whole-node masks
#   BERT_SQUAD_NETWORK   the collectives' network the site sets up (ofi)  BERT_SQUAD_SWEEP_DIR  a sweep's task
# Training arguments: the script's own arguments (sbatch <script> ARGS...), else the site's DEFAULT_ARGS.
set -euo pipefail

# 1. Inputs. `bert-squad launch --submit` runs the site script to the end of this part on the submit host too
# (BERT_SQUAD_CHECK_ONLY=1), so what it refuses is refused before sbatch, by the same lines.
die() { echo "bert-squad: error: $*" >&2; exit 2; }
# sbatch runs a spooled copy of the site script, so the checkout is found from the submit directory.
export BERT_SQUAD_REPO=${BERT_SQUAD_REPO:-${SLURM_SUBMIT_DIR:-$PWD}}
RUNTIME=${BERT_SQUAD_RUNTIME:-none}
LAUNCHER=${BERT_SQUAD_LAUNCHER:-srun}
REQUEUE=${BERT_SQUAD_REQUEUE:-0}
case "$REQUEUE" in 0|1) ;; *) die "BERT_SQUAD_REQUEUE=$REQUEUE: use 1 (requeue after a checkpointed stop) or 0" ;; esac
export BERT_SQUAD_SCRATCH=${BERT_SQUAD_SCRATCH:?the site script sets it} BERT_SQUAD_WORK=${BERT_SQUAD_WORK:?the site script sets it}
# (Exported: an EDF names the image and the scratch as ${BERT_SQUAD_IMAGE} and ${BERT_SQUAD_SCRATCH}.)
export BERT_SQUAD_IMAGE=${BERT_SQUAD_IMAGE:-}
IMAGE=$BERT_SQUAD_IMAGE
# Compute nodes are offline: everything comes from the cache that `bert-squad download` filled.
export BERT_SQUAD_CACHE=${BERT_SQUAD_CACHE:-$BERT_SQUAD_WORK/cache}
# Bind the scratch, the checkout and the cache, each once (a path under another is already visible), as
# the job names them: on LUMI /scratch/<project> is a symlink, and only the path itself is seen inside.
MOUNTS=()
for dir in "$BERT_SQUAD_SCRATCH" "$BERT_SQUAD_REPO" "$BERT_SQUAD_CACHE"; do
  dir=$(realpath -ms "$dir")
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
      if [ "$RUNTIME" = ce ]; then
        [ -f "${BERT_SQUAD_EDF:-}" ] || die "BERT_SQUAD_EDF=${BERT_SQUAD_EDF:-}: no such file (an EDF, CSCS's Environment Definition File)"
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
  local arch=${BERT_SQUAD_ARCH:-} machine found
  [ -n "$arch" ] && [ -f "$IMAGE" ] && command -v unsquashfs >/dev/null || return 0
  machine=$(unsquashfs -cat "$IMAGE" usr/bin/env 2>/dev/null | od -An -tu2 -j18 -N2 | tr -d ' ') || true
  case "$machine" in 183) found=aarch64 ;; 62) found=x86_64 ;; *) return 0 ;; esac
  [ "$found" = "$arch" ] || die "image $IMAGE is built for $found, the nodes run $arch: build it on (or for) $arch (containers/README.md)"
}
check_inputs
[ "${BERT_SQUAD_CHECK_ONLY:-0}" = 0 ] || exit 0
cd "$BERT_SQUAD_REPO"
[ -d bert_squad ] || die "$BERT_SQUAD_REPO has no bert_squad/: submit from the repository root or set BERT_SQUAD_REPO"
[ -n "${SLURM_JOB_ID:-}" ] || die "not inside a Slurm job: submit with sbatch, or run it inside salloc"

export HF_HOME=$BERT_SQUAD_CACHE/hf HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# What the ranks must see in a container even where its image sets its own (pyxis: --container-env; ce: the
# EDF's [env] sets the offline switches; the other runtimes pass the environment through).
CONTAINER_ENV=(HF_HOME HF_HUB_OFFLINE HF_DATASETS_OFFLINE TRANSFORMERS_OFFLINE)
# Each rank's cores: --cpus-per-task, or, where the job did not ask (Slurm's defaults gave them), the node's share.
CPUS_PER_RANK=${SLURM_CPUS_PER_TASK:-$(( ${SLURM_CPUS_ON_NODE:-1} / ${SLURM_NTASKS_PER_NODE:-1} ))}
[ "$CPUS_PER_RANK" -ge 1 ] || CPUS_PER_RANK=1
export OMP_NUM_THREADS=$CPUS_PER_RANK PYTHONUNBUFFERED=1
# The variable each rank narrows to its own GPU: none in a job without GPUs.
[ -n "${SLURM_GPUS_PER_NODE:-}${SLURM_GPUS_PER_TASK:-}${SLURM_GPUS:-}" ] || BERT_SQUAD_GPU_ENV=
export BERT_SQUAD_GPU_ENV=${BERT_SQUAD_GPU_ENV:-}
# The collectives' network the site configures (ofi: the libfabric plugin); a rank that finds NCCL/RCCL
# on sockets instead says so in its log (bert_squad/transport.py).
export BERT_SQUAD_NETWORK=${BERT_SQUAD_NETWORK:-}
# CPU masks name the cores next to each of a node's GPUs: only right when the job has the whole node.
BERT_SQUAD_CPU_BIND=${BERT_SQUAD_CPU_BIND:-}
IFS=, read -ra masks <<< "${BERT_SQUAD_CPU_BIND#mask_cpu:}"
CPU_BIND=
[ "${#masks[@]}" != "${SLURM_NTASKS_PER_NODE:-0}" ] || CPU_BIND=$BERT_SQUAD_CPU_BIND
# The exit code of a run that stopped at a checkpoint: bert_squad.preemption.EXIT_STOPPED (a test holds them equal).
STOPPED=75

if [ "$#" -gt 0 ]; then
  TRAIN_ARGS=("$@")
else
  TRAIN_ARGS=("${DEFAULT_ARGS[@]}")
fi
# What the ranks run (training, on the training arguments), and what the cache check adds: a sweep's array task
# trains its own combination, on the manifest's training arguments, into the sweep directory, which it proves writable.
RANK_ARGS=("${TRAIN_ARGS[@]}") CHECK_ARGS=()
if [ -n "${BERT_SQUAD_SWEEP_DIR:-}" ]; then
  RANK_ARGS=(sweep run "$BERT_SQUAD_SWEEP_DIR") CHECK_ARGS=(--output-dir "$BERT_SQUAD_SWEEP_DIR")
fi
read -ra RUNTIME_FLAGS <<< "${BERT_SQUAD_RUNTIME_FLAGS:-}"

# 2. The container runtime, then the cache check in its image.
# >>> each runtime's launch: it wraps every rank's command (RUN), or is options of srun (CONTAINER).
CONTAINER=()
# What the one task before the ranks runs in the image (the download, or the cache check).
# shellcheck disable=SC2016  # expanded inside the container
IN_IMAGE='cd "$BERT_SQUAD_REPO" && exec python -m bert_squad "$@"'
case "$RUNTIME" in
  ce)  # CSCS Container Engine: the EDF names the image, mounts and environment.
    CONTAINER=("--environment=$BERT_SQUAD_EDF" "${RUNTIME_FLAGS[@]}")
    # Only the EDF's mounts are inside: what the job needs of the host must be among them, or a cache outside
    # them would be filled in the container and lost with it, or found empty. Checked where IN_IMAGE runs.
    IN_IMAGE="for m in$(printf ' %q' "${MOUNTS[@]}"); do [ -d \"\$m\" ] || { echo \"bert-squad: error: \$m is not inside the container: add it to the mounts of \$BERT_SQUAD_EDF\" >&2; exit 2; }; done; $IN_IMAGE"
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
    # try it once here, and that the ranks can resolve the master, the allocation's first node, where the ranks'
    # step (which spans the allocation) starts (else the rendezvous waits forever).
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
  uenv)  # CSCS uenv: #SBATCH --uenv/--view mount it; the site script puts the package's venv on PATH.
    [ -d /user-environment ] || die "no uenv at /user-environment: add #SBATCH --uenv=<image>:/user-environment and --view"
    RUN=() ;;
  none) RUN=() ;;
  *) die "BERT_SQUAD_RUNTIME=$RUNTIME: use ce, pyxis, sarus, singularity, apptainer, charliecloud, uenv or none" ;;
esac
# <<< each runtime's launch

# What runs once, before the ranks: in the image (ce and pyxis: a job step on the batch shell's node).
ONCE=("${RUN[@]}")
[ "${#CONTAINER[@]}" = 0 ] || ONCE=(srun --ntasks=1 --nodes=1 "${CONTAINER[@]}")
# `sbatch <site script> download --model ...`: fill the cache from inside the image, once, then stop
# (`download` goes online for itself, whatever the image says about offline mode).
if [ "${TRAIN_ARGS[0]:-}" = download ]; then
  exec "${ONCE[@]}" bash -c "$IN_IMAGE" bert-squad "${TRAIN_ARGS[@]}"
fi

# Fail here, in seconds, rather than in every rank after the containers started: the package itself
# says whether the run's model and dataset are in the cache (one definition of its layout).
# Its error line alone, without the launcher's own ("srun: error: ... Exited with exit code 2").
# shellcheck disable=SC2016  # expanded inside the container
if ! out=$("${ONCE[@]}" bash -c "$IN_IMAGE >/dev/null" check-cache check-cache "${TRAIN_ARGS[@]}" "${CHECK_ARGS[@]}" 2>&1); then
  grep '^bert-squad' <<< "$out" >&2 || echo "$out" >&2
  exit 2
fi

# 3. Each rank, inside the container: its place from the launcher's variables, then its own GPU.
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
    LAUNCH=(srun --ntasks="$SLURM_NTASKS" --cpus-per-task="$CPUS_PER_RANK" "${CONTAINER[@]}")
    [ -z "$CPU_BIND" ] || LAUNCH+=("--cpu-bind=$CPU_BIND") ;;
  *) die "BERT_SQUAD_LAUNCHER=$LAUNCHER: use mpirun or srun" ;;
esac
CMD=("${LAUNCH[@]}" "${RUN[@]}" bash -c "$RANK_SH" bert-squad-rank "${RANK_ARGS[@]}")

# Rendezvous: every rank derives MASTER_ADDR and MASTER_PORT itself (bert_squad.distributed.slurm_rendezvous,
# the one rule): under srun the first node of the ranks' step and a port from the job id and the step id (or
# one Slurm reserved for the step), under mpirun the first node of the job and a port from mpirun's namespace
# (docs/clusters.md says which runs on one node never share a port; two that do fail in one line).
# This step spans the allocation, so its first node is the job's.
echo "bert-squad: job $SLURM_JOB_ID, ${SLURM_JOB_NUM_NODES:-1} node(s), $SLURM_NTASKS rank(s), nodes $SLURM_JOB_NODELIST"
echo "bert-squad: runtime $RUNTIME${IMAGE:+ image $IMAGE}${BERT_SQUAD_EDF:+ environment $BERT_SQUAD_EDF}, launcher $LAUNCHER, cache $BERT_SQUAD_CACHE"
printf 'bert-squad: training arguments:'; printf ' %q' "${TRAIN_ARGS[@]}"; echo
printf 'bert-squad: running:'; printf ' %q' "${CMD[@]}"; echo

# 4. Slurm's end-of-job warning (--signal=B:USR1@...) reaches only this shell: pass it to the launcher,
# which forwards it to the ranks; they checkpoint at the next step and exit with $STOPPED.
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
if [ "$status" = "$STOPPED" ]; then
  if [ "$REQUEUE" = 1 ]; then
    echo "bert-squad: stopped at a checkpoint; requeueing job $SLURM_JOB_ID to resume"
    scontrol requeue "$SLURM_JOB_ID"
  else
    echo "bert-squad: stopped at a checkpoint; resubmit with --resume auto and the same --output-dir to continue"
  fi
fi
exit "$status"
