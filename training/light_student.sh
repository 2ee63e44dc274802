#!/bin/sh
# The light-reading student measured in docs/lighting.md ("The light-reading encoder"): the shipped default's
# student widened to read the shading prior through a sixth G-buffer encoder branch, trained on world v2's
# 12 light scenes at 128x128 (runs/data-v2-lr, finetune_v2.sh's) with the physics world mixed in, then a refiner
# retrained on its frames; exported to runs/model-lit2r. About 75 minutes on 2 cores (most of it the first run's
# latent cache: the Wan VAE over the physics clips). Run from the repository root with the project's venv.
set -e
export OMP_NUM_THREADS=1
AF=${AF:-.venv/bin/alaya-flash}
C=training/configs
R="${RUNS:-runs}"
I="$R/imported-default"
$AF --quiet train import --config $C/import.json --set model=model_zoo/default --set out=$I
S="--set codecs_run=$I/codecs --set vae_run=$I/vae --set data=$R/data-v2-lr --set frames=13 --set window_frames=1"
S="$S --set sink_frames=1 --set caption_rate=0.5 --set mix_data=$R/data --set mix_rate=0.35 --set mix_max_windows=16"
S="$S --set threads=1 --set prompt_light_rate=0.35 --set shadow_pass_rate=0.5 --set steps=1200 --set decay_steps=400 --set lr=5e-5"
$AF --quiet train student-rollout --config $C/student-rollout.json $S --set out=$R/lit1 \
    --set student_run=$I/student --set reads_light=true
# the prior's input columns at their own rate: at 5e-5 they stayed at norm 0.25 (the passes' 12.2)
mkdir -p $R/lit2 && ln -f $R/lit1/latents-*.safetensors $R/lit2/  # the same clips: not encoded again
$AF --quiet train student-rollout --config $C/student-rollout.json $S --set out=$R/lit2 \
    --set student_run=$R/lit1 --set light_lr=1e-3
E="--set student_run=$R/lit2 --set teacher_run=$I/teacher --set codecs_run=$I/codecs --set vae_run=$I/vae"
$AF --quiet train export --config $C/export.json $E --set refiner_run=$I/refiner --set out=$R/model-lit2
$AF --quiet train refiner --config $C/refiner-given.json --set model=$R/model-lit2 --set data=$R/data-v2-lr \
    --set mix_data=$R/data --set out=$R/refiner-lit2 --set threads=1
$AF --quiet train export --config $C/export.json $E --set refiner_run=$R/refiner-lit2 --set out=$R/model-lit2r
