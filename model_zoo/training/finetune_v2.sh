#!/bin/sh
# Fine-tune the embedded default (model_zoo/default/) on world v2: path-traced streets, courtyards and
# rooms with cast shadows, reflections and sky (docs/world.md). Run from the repository root with the
# project's venv: sh model_zoo/training/finetune_v2.sh   (RUNS=elsewhere to keep runs/ apart)
# The result is a model folder, $RUNS/model-v2m4c (docs/training.md "Fine-tuning on world v2"), trained on world v2
# and on the physics world the default learned (the shipped recipe's data.json, $RUNS/data); nothing in
# model_zoo/default/ changes. Every stage resumes from its latest checkpoint if interrupted.
set -e
# torch threads per stage: 1 (the default) where other work shares the CPU, whose busy cores make two threads
# 5-10x slower; THREADS=2 on two free cores (a 256x256 student step 1.6x faster, docs/training.md)
export OMP_NUM_THREADS=${THREADS:-1}
T="--set threads=${THREADS:-1}"
AF=${AF:-.venv/bin/alaya-flash}
C=model_zoo/training/configs
R="${RUNS:-runs}"
# 24 + 4 clips, 2.4-4.3 min each on 2 free cores with Mitsuba's llvm_ad_rgb (docs/world.md "Speed and
# noise"), the held-out ones twice that (two passes a truth, which measure its noise: heldout_passes);
# TRAIN_CLIPS=12 takes the first 12 (rendering only those not yet on disk)
$AF --quiet train data --config $C/data-v2.json --set out=$R/data-v2 --set train_clips=${TRAIN_CLIPS:-24} \
    --set heldout_clips=${HELDOUT_CLIPS:-4}
# the physics world's clips the default was trained on (train_default.sh's first stage; minutes)
$AF --quiet train data --config $C/data.json --set out=$R/data
# the shipped networks as run folders: the VAE (its round trip on world v2's held-out clips is
# 23.7 dB against 21.8 on the physics world's, so it is kept), the codecs, the student
$AF --quiet train import --config $C/import.json --set out=$R/imported
# the student streams whole world v2 clips through the shipped session's cache (window 1, sink 1) and
# is regressed onto their ground-truth latents; half its prompts are the clips' captions, which name
# the sun's side (the G-buffers cannot say it). A third of its steps stream physics-world clips instead
# (32 of the shipped dataset's, mix_data): trained on world v2 alone it forgot that world (26.8 -> 13.6 dB).
# 400 steps at 3e-5, then 1,200 more at 1e-4 from them
S="--set data=$R/data-v2 --set vae_run=$R/imported/vae --set codecs_run=$R/imported/codecs --set window_frames=1"
S="$S --set sink_frames=1 --set caption_rate=0.5 --set mix_data=$R/data --set mix_rate=0.35"
S="$S --set mix_max_windows=32 $T"
# every decoder refit and every refiner: both worlds, 35% of the steps or crops from the physics world
D="$T --set mix_rate=0.35 --set window_frames=1 --set steps=1000 --set decay_steps=300"
F="$T --set data=$R/data-v2 --set mix_data=$R/data --set mix_rate=0.35 --set clips=24 --set target=truth"
# the context refiner (gbuffer-refiner-16-context): half of its world v2 crops read with the clip's caption (the
# sun's side), on 128x128 crops (whole frames scored the same)
FC="$F --set config=gbuffer-refiner-16-context --set caption_rate=0.5 --set crop=128 --set steps=6000 --set decay_steps=3000"
$AF --quiet train student-rollout --config $C/student-rollout.json $S --set out=$R/student-v2m \
    --set student_run=$R/imported/student --set steps=400 --set decay_steps=100 --set lr=3e-5
mkdir -p $R/student-v2m2 && ln -f $R/student-v2m/latents-*.safetensors $R/student-v2m2/  # the same clips: not encoded again
$AF --quiet train student-rollout --config $C/student-rollout.json $S --set out=$R/student-v2m2 \
    --set student_run=$R/student-v2m --set steps=1200 --set decay_steps=400 --set lr=1e-4
# the tiny decoder was fitted to the shipped student's latents: it must learn the new student's, on both worlds
$AF --quiet train decoder --config $C/decoder.json --set out=$R/decoder-v2m --set student_run=$R/student-v2m2 \
    --set latents=$R/student-v2m2/latents-train.safetensors --set mix_latents=$R/student-v2m2/latents-mix.safetensors \
    --set codecs_run=$R/imported/codecs $D
# first without a refiner: the shipped one learned the physics world's shading and costs 1.1 dB on world v2
E="--set student_run=$R/student-v2m2 --set teacher_run=$R/imported/teacher --set codecs_run=$R/decoder-v2m"
$AF --quiet train export --config $C/export.json $E --set vae_run=$R/imported/vae --set out=$R/model-v2m
# a refiner of its own for both worlds: it learns that model's errors on the first 24 training clips of each
# (world v2's are all the student saw; there are no others), a third of its crops from the physics world
$AF --quiet train refiner --config $C/refiner.json --set out=$R/refiner-v2m --set model=$R/model-v2m \
    $F --set steps=3000 --set decay_steps=1500
$AF --quiet train export --config $C/export.json $E --set vae_run=$R/imported/vae --set refiner_run=$R/refiner-v2m \
    --set out=$R/model-v2m-refined
# the student 2,400 steps further on all 24 training clips (the two runs above trained on the first 19: a
# new clip count encodes the clips again), its decoder continued from the last one, and the refiner above
S3="$S --set out=$R/student-v2m3 --set student_run=$R/student-v2m2"
mkdir -p $R/student-v2m3 && ln -f $R/student-v2m2/latents-mix.safetensors $R/student-v2m3/  # the physics clips: the same
$AF --quiet train student-rollout --config $C/student-rollout.json $S3 --set steps=2400 --set decay_steps=800 --set lr=1e-4
$AF --quiet train decoder --config $C/decoder.json --set out=$R/decoder-v2m3 --set student_run=$R/student-v2m3 \
    --set latents=$R/student-v2m3/latents-train.safetensors --set mix_latents=$R/student-v2m3/latents-mix.safetensors \
    --set codecs_run=$R/decoder-v2m $D
E3="--set student_run=$R/student-v2m3 --set teacher_run=$R/imported/teacher --set codecs_run=$R/decoder-v2m3"
$AF --quiet train export --config $C/export.json $E3 --set vae_run=$R/imported/vae --set out=$R/model-v2m3
$AF --quiet train export --config $C/export.json $E3 --set vae_run=$R/imported/vae --set refiner_run=$R/refiner-v2m \
    --set out=$R/model-v2m3-refined
# a context refiner of the third student's own
$AF --quiet train refiner --config $C/refiner.json --set out=$R/refiner-v2m3c --set model=$R/model-v2m3 $FC
$AF --quiet train export --config $C/export.json $E3 --set vae_run=$R/imported/vae --set refiner_run=$R/refiner-v2m3c \
    --set out=$R/model-v2m3c
# the student 1,600 steps further (the same clips: their latents are not encoded again), its decoder continued,
# and a context refiner of its own: $R/model-v2m4c
S4="$S --set out=$R/student-v2m4 --set student_run=$R/student-v2m3"
mkdir -p $R/student-v2m4 && ln -f $R/student-v2m3/latents-*.safetensors $R/student-v2m4/
$AF --quiet train student-rollout --config $C/student-rollout.json $S4 --set steps=1600 --set decay_steps=600 --set lr=1e-4
$AF --quiet train decoder --config $C/decoder.json --set out=$R/decoder-v2m4 --set student_run=$R/student-v2m4 \
    --set latents=$R/student-v2m4/latents-train.safetensors --set mix_latents=$R/student-v2m4/latents-mix.safetensors \
    --set codecs_run=$R/decoder-v2m3 $D
E4="--set student_run=$R/student-v2m4 --set teacher_run=$R/imported/teacher --set codecs_run=$R/decoder-v2m4"
$AF --quiet train export --config $C/export.json $E4 --set vae_run=$R/imported/vae --set out=$R/model-v2m4
$AF --quiet train refiner --config $C/refiner.json --set out=$R/refiner-v2m4c --set model=$R/model-v2m4 $FC
$AF --quiet train export --config $C/export.json $E4 --set vae_run=$R/imported/vae --set refiner_run=$R/refiner-v2m4c \
    --set out=$R/model-v2m4c
