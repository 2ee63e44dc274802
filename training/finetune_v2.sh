#!/bin/sh
# Build the shipped default (model_zoo/default/) from the physics-world model train_default.sh writes there: that
# model fine-tuned on world v2 (path-traced streets, courtyards and rooms with
# cast shadows, reflections and sky; docs/world.md) and on the physics world it learned. Mostly at half size: the
# student and decoder train on 128x128 clips (2.6x cheaper to path trace than 256x256, the same quality per
# student step; docs/training.md "Half-resolution data"), the refiner on whole 128x128 world v2 frames and 128x128 crops
# of the physics world's 256x256 ones; then the student is finished on 256x256 clips of both worlds. Run from the
# repository root with the project's venv:
#   THREADS=2 sh training/finetune_v2.sh   (about 6 hours on 2 free cores; RUNS=elsewhere keeps runs/ apart,
#   OUT=runs/model leaves model_zoo/ alone). Every stage resumes from its latest checkpoint if interrupted.
# Last, a refiner that reads the light (the shading prior's planes, and a share of the prior to mix in per pixel)
# learns the fine-tuned model's frames of 12 more world v2 scenes and the physics world's (docs/lighting.md).
set -e
# torch threads per stage: 1 (the default) where other work shares the CPU, whose busy cores make two threads
# 5-10x slower; THREADS=2 on two free cores (a 128x128 student step 1.2x faster, docs/training.md)
export OMP_NUM_THREADS=${THREADS:-1}
T="--set threads=${THREADS:-1}"
AF=${AF:-.venv/bin/alaya-flash}
C=training/configs
R="${RUNS:-runs}"
OUT="${OUT:-model_zoo/default}"
# the fine-tuned networks before the light-reading refiner
MODEL="$R/model-world-v2"
# the physics world's clips the default was trained on, at 128x128 for the student and decoder and at 256x256
# (train_default.sh's first stage) for the refiner
$AF --quiet train data --config $C/data.json --set out=$R/data-128 --set width=128 --set height=128
$AF --quiet train data --config $C/data.json --set out=$R/data
# world v2's first 19 training clips at 128x128 (1.3 min each on 2 free cores with Mitsuba's llvm_ad_rgb);
# 5 more are rendered before the fourth student run, which sees all 24
$AF --quiet train data --config $C/data-v2.json --set out=$R/data-v2-128 --set width=128 --set height=128 \
    --set train_clips=19 --set heldout_clips=0
# the shipped networks as run folders (the VAE, the codecs, the student, the teacher)
$AF --quiet train import --config $C/import.json --set out=$R/imported
# the student streams whole world v2 clips through the shipped sampler's cache (window 1, sink 1) and is
# regressed onto their ground-truth latents; half its prompts are the clips' captions, which name the sun's side
# (the G-buffers cannot say it). A third of its steps stream physics-world clips instead (32 of them, mix_data):
# trained on world v2 alone it forgot that world (26.8 -> 13.6 dB)
S="--set data=$R/data-v2-128 --set vae_run=$R/imported/vae --set codecs_run=$R/imported/codecs --set window_frames=1"
S="$S --set sink_frames=1 --set caption_rate=0.5 --set mix_data=$R/data-128 --set mix_rate=0.35 --set mix_max_windows=32 $T"
# every decoder refit: both worlds' latents of the student before it, a third of its steps the physics world's
D="$T --set mix_rate=0.35 --set window_frames=1 --set steps=1000 --set decay_steps=300"
# 400 steps at 3e-5, then 1,200 at 1e-4 from them, and the decoder refitted to that student's latents
$AF --quiet train student-rollout --config $C/student-rollout.json $S --set out=$R/s128-v2m \
    --set student_run=$R/imported/student --set steps=400 --set decay_steps=100 --set lr=3e-5
mkdir -p $R/s128-v2m2 && ln -f $R/s128-v2m/latents-*.safetensors $R/s128-v2m2/  # the same clips: not encoded again
$AF --quiet train student-rollout --config $C/student-rollout.json $S --set out=$R/s128-v2m2 \
    --set student_run=$R/s128-v2m --set steps=1200 --set decay_steps=400 --set lr=1e-4
$AF --quiet train decoder --config $C/decoder.json --set out=$R/d128-v2m --set student_run=$R/s128-v2m2 \
    --set latents=$R/s128-v2m2/latents-train.safetensors --set mix_latents=$R/s128-v2m2/latents-mix.safetensors \
    --set codecs_run=$R/imported/codecs $D
# 1,200 steps more on the same clips, the decoder continued
mkdir -p $R/s128-v2m3 && ln -f $R/s128-v2m2/latents-*.safetensors $R/s128-v2m3/
$AF --quiet train student-rollout --config $C/student-rollout.json $S --set out=$R/s128-v2m3 \
    --set student_run=$R/s128-v2m2 --set steps=1200 --set decay_steps=400 --set lr=1e-4
$AF --quiet train decoder --config $C/decoder.json --set out=$R/d128-v2m3 --set student_run=$R/s128-v2m3 \
    --set latents=$R/s128-v2m3/latents-train.safetensors --set mix_latents=$R/s128-v2m3/latents-mix.safetensors \
    --set codecs_run=$R/d128-v2m $D
# all 24 clips (a new clip count encodes them again; the physics clips' latents are the same): 1,600 steps more
$AF --quiet train data --config $C/data-v2.json --set out=$R/data-v2-128 --set width=128 --set height=128 \
    --set train_clips=24 --set heldout_clips=0
mkdir -p $R/s128-v2m4 && ln -f $R/s128-v2m3/latents-mix.safetensors $R/s128-v2m4/
$AF --quiet train student-rollout --config $C/student-rollout.json $S --set out=$R/s128-v2m4 \
    --set student_run=$R/s128-v2m3 --set steps=1600 --set decay_steps=600 --set lr=1e-4
$AF --quiet train decoder --config $C/decoder.json --set out=$R/d128-v2m4 --set student_run=$R/s128-v2m4 \
    --set latents=$R/s128-v2m4/latents-train.safetensors --set mix_latents=$R/s128-v2m4/latents-mix.safetensors \
    --set codecs_run=$R/d128-v2m3 $D
E="--set student_run=$R/s128-v2m4 --set teacher_run=$R/imported/teacher --set codecs_run=$R/d128-v2m4 --set vae_run=$R/imported/vae"
$AF --quiet train export --config $C/export.json $E --set out=$R/m128-v2m4
# a context refiner (gbuffer-refiner-16-context) learns that model's errors on both worlds, a third of its crops
# the physics world's, half its world v2 crops read with the clip's caption (the sun's side)
$AF --quiet train refiner --config $C/refiner.json --set out=$R/r128-v2m4c --set model=$R/m128-v2m4 $T \
    --set data=$R/data-v2-128 --set mix_data=$R/data --set mix_rate=0.35 --set clips=24 --set target=truth \
    --set config=gbuffer-refiner-16-context --set caption_rate=0.5 --set crop=128 --set steps=6000 --set decay_steps=3000
# a finish at 256x256, the size it runs at: what the student fits at 128x128 does not carry to 256x256 (docs/training.md,
# "What limits it"). World v2's first 10 training clips at 256x256 (3.4 minutes each) and the physics world's 256x256
# clips mixed in (16 windows): 600 steps at 5e-5, 1,200 more on the same clips, 1,200 more on 26 clips. The decoder
# and refiner are kept: refitted to the finished student they scored no better (docs/training.md, "The finish at 256x256")
$AF --quiet train data --config $C/data-v2.json --set out=$R/data-v2 --set train_clips=10 --set heldout_clips=0
F="--set data=$R/data-v2 --set vae_run=$R/imported/vae --set codecs_run=$R/imported/codecs --set window_frames=1"
F="$F --set sink_frames=1 --set caption_rate=0.5 --set mix_data=$R/data --set mix_rate=0.35 --set mix_max_windows=16 $T"
$AF --quiet train student-rollout --config $C/student-rollout.json $F --set out=$R/s256-ft \
    --set student_run=$R/s128-v2m4 --set steps=600 --set decay_steps=200 --set lr=5e-5
mkdir -p $R/s256-ft2 && ln -f $R/s256-ft/latents-*.safetensors $R/s256-ft2/  # the same clips: not encoded again
$AF --quiet train student-rollout --config $C/student-rollout.json $F --set out=$R/s256-ft2 \
    --set student_run=$R/s256-ft --set steps=1200 --set decay_steps=400 --set lr=5e-5
# more steps on those 10 clips no longer paid (+0.05 dB for 1,200), more scenes did: 16 more training clips at
# 256x256 and world v2's 3 held-out clips (the ones eval scores), then 1,200 steps on all 26 (a new clip count encodes
# them again; the physics clips' latents are the same)
$AF --quiet train data --config $C/data-v2.json --set out=$R/data-v2 --set train_clips=26 --set heldout_clips=3
mkdir -p $R/s256-ft3 && ln -f $R/s256-ft2/latents-mix.safetensors $R/s256-ft3/
$AF --quiet train student-rollout --config $C/student-rollout.json $F --set out=$R/s256-ft3 \
    --set student_run=$R/s256-ft2 --set steps=1200 --set decay_steps=400 --set lr=5e-5
E256="--set student_run=$R/s256-ft3 --set teacher_run=$R/imported/teacher --set codecs_run=$R/d128-v2m4 --set vae_run=$R/imported/vae"
$AF --quiet train export --config $C/export.json $E256 --set refiner_run=$R/r128-v2m4c --set out=$MODEL
# the light: 12 more world v2 scenes at 128x128 (13 frames, 8 samples a pixel, seeds 1000-1011; each frame's light
# recorded), and a blending refiner trained on the fine-tuned model's frames of them and of 7 physics-world clips,
# beside the prior under each clip's recorded light or (35% of the crops) the light head's reading of its prompt, with
# the world v2 crops' shadows (75% of the recorded-light ones) from their recorded sun visibility, as an engine's
# shadow pass gives them; two input flags tell it which light and which shadows each crop got
$AF --quiet train data --config $C/data-v2.json --set out=$R/data-v2-lr --set width=128 --set height=128 --set frames=13 \
    --set train_clips=12 --set heldout_clips=0 --set train_seed=1000 --set spp=8
$AF --quiet train refiner --config $C/refiner-given.json --set model=$MODEL --set data=$R/data-v2-lr --set mix_data=$R/data \
    --set out=$R/refiner-given $T
$AF --quiet train export --config $C/export.json $E256 --set refiner_run=$R/refiner-given --set out=$OUT
