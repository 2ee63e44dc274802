#!/bin/sh
# Fine-tune the embedded default (model_zoo/default/) on world v2: path-traced streets, courtyards and
# rooms with cast shadows, reflections and sky (docs/world.md). Run from the repository root with the
# project's venv: sh model_zoo/training/finetune_v2.sh   (RUNS=elsewhere to keep runs/ apart)
# The result is a model folder in $RUNS/model-v2 (and $RUNS/model-v2-anchored); nothing in
# model_zoo/default/ changes. Every stage resumes from its latest checkpoint if interrupted.
set -e
export OMP_NUM_THREADS=1  # on a shared CPU, one thread per process is 5-10x faster than oversubscribed ones
AF=${AF:-.venv/bin/alaya-flash}
C=model_zoo/training/configs
R="${RUNS:-runs}"
# 24 + 4 clips, 3.1-4.3 min each on 2 free cores with Mitsuba's llvm_ad_rgb (docs/world.md "Speed and
# noise"); TRAIN_CLIPS=12 takes the first 12 (rendering only those not yet on disk)
$AF --quiet train data --config $C/data-v2.json --set out=$R/data-v2 --set train_clips=${TRAIN_CLIPS:-24} \
    --set heldout_clips=${HELDOUT_CLIPS:-4}
# the shipped networks as run folders: the VAE (its round trip on world v2's held-out clips is
# 23.7 dB against 21.8 on the physics world's, so it is kept), the codecs, the student, the refiner
$AF --quiet train import --config $C/import.json --set out=$R/imported
# the student streams whole world v2 clips through the shipped session's cache (window 1, sink 1) and
# is regressed onto their ground-truth latents; half its prompts are the clips' captions, which name
# the sun's side (the G-buffers cannot say it)
$AF --quiet train student-rollout --config $C/student-rollout.json --set out=$R/student-v2 \
    --set data=$R/data-v2 --set student_run=$R/imported/student --set vae_run=$R/imported/vae \
    --set codecs_run=$R/imported/codecs --set window_frames=1 --set sink_frames=1 --set caption_rate=0.5 \
    --set steps=${STUDENT_STEPS:-400} --set decay_steps=150 --set lr=3e-5
# the tiny decoder was fitted to the shipped student's latents: it must learn the new student's
$AF --quiet train decoder --config $C/decoder.json --set out=$R/decoder-v2 --set data=$R/data-v2 \
    --set student_run=$R/student-v2 --set latents=$R/student-v2/latents-train.safetensors \
    --set codecs_run=$R/imported/codecs --set window_frames=1 --set steps=1000 --set decay_steps=300
$AF --quiet train export --config $C/export.json --set out=$R/model-v2 --set student_run=$R/student-v2 \
    --set teacher_run=$R/imported/teacher --set codecs_run=$R/decoder-v2 --set vae_run=$R/imported/vae \
    --set refiner_run=$R/imported/refiner
