#!/bin/sh
# Rebuild the embedded default model (model_zoo/default/) from nothing, stage by stage.
# Run from the repository root with the project's venv: sh training/train_default.sh
# Each stage resumes from its latest checkpoint if interrupted; outputs go to runs/.
# Every stage is bounded by its config's steps, so the weights do not depend on the machine's speed.
set -e
export OMP_NUM_THREADS=1  # on a shared CPU, one thread per process is 5-10x faster than oversubscribed ones
AF=${AF:-.venv/bin/alaya-flash}
C=training/configs
# DATA=data-v2.json sh training/train_default.sh: the same recipe on world v2 (path-traced
# streets, courtyards and rooms, docs/world.md), in a fresh runs/
DATA="${DATA:-data.json}"
# world v2's captions name the clip's scene and the sun's side (the G-buffers cannot say it): the teacher and
# the rollout student read them for half their prompts, the preset wordings for the rest
CAPTIONS=""
if [ "$DATA" = "data-v2.json" ]; then CAPTIONS="--set caption_rate=0.5"; fi
$AF --quiet train data --config $C/$DATA
# the VAE learns on 5-frame crops first, then resumes on 9- and 17-frame ones: its causal caches must
# carry several latents of the past, as when it encodes and decodes whole clips (trained on 5 frames
# only, its later frames came out 2-3 dB worse and its latents past the second drifted)
$AF --quiet train vae --config $C/vae.json --set steps=2800 --set decay_steps=1000 --set frames=5 --set crop=64 --set motion_weight=0
$AF --quiet train vae --config $C/vae.json --set steps=3600 --set decay_steps=0 --set frames=9 --set crop=48 --set motion_weight=0
$AF --quiet train vae --config $C/vae.json --set steps=8000
# 8,000 more steps on 17 frames (from full learning rate again, decayed over the last 1,500): round trip
# 20.84 -> 21.74 dB, 1.5 -> ~0.9 dB lost to colour, cross-latent change ratio 2.11 -> 1.68 (fourth build)
$AF --quiet train vae --config $C/vae.json
# the teacher encodes every training window once (steps=0: only that), then trains while the codecs
# are distilled from those cached latents
$AF --quiet train teacher --config $C/teacher.json --set steps=0 --set threads=2
# the codecs first learn from crops of those cached 9-frame latents (no VAE pass per step), then resume
# on 17- and 25-frame crops encoded by the VAE as one stream: they run as streams over whole clips at
# render time, and trained on 9 frames only their latents past the third drifted (G-buffer latent error 2.2)
# a last phase prices the change into each latent's first frame (boundary_weight): the decoder continues
# from the frame it last gave back instead of jumping at every latent (cross-latent ratio 2.11 -> 0.84)
P="--set lr=0.001 --set boundary_weight=0"
( $AF --quiet train codecs --config $C/codecs.json $P --set steps=2000 --set decay_steps=0 --set frames=9 --set crop=64 \
    --set latents=runs/teacher/latents-train.safetensors &&
  $AF --quiet train codecs --config $C/codecs.json $P --set steps=2600 --set frames=17 &&
  $AF --quiet train codecs --config $C/codecs.json $P --set steps=4200 &&
  $AF --quiet train codecs --config $C/codecs.json ) &
CODECS=$!
# all 8 wordings per preset (prompts.py) from the first step: trained on 3, the third build's teacher
# put held-out paraphrases between presets (62.5% control, 81% once continued on 8)
$AF --quiet train teacher --config $C/teacher.json $CAPTIONS
wait $CODECS
$AF --quiet train student-ode --config $C/student-ode.json
$AF --quiet train student-dmd --config $C/student-dmd.json
# student-rollout: the ODE student streams whole 25-frame clips through its own rolling cache (sink 1,
# window 6, evictions as at render time) and is regressed onto the ground-truth latents, so it learns
# from the past it will really read; then the tiny decoder adapts to that student's latents (decoder)
$AF --quiet train student-rollout --config $C/student-rollout.json $CAPTIONS
$AF --quiet train decoder --config $C/decoder.json
# the default ships the rollout student with the adapted decoder (export.json); the DMD student is
# exported beside it with the codecs it was trained on
$AF --quiet train export --config $C/export.json
# the G-buffer refiner learns the exported model's own errors from its renders of 64 scenes the student
# never saw (seeds 64-127, every preset), reading each frame beside its full-resolution G-buffers and
# the prompt; export again with it (scenes the student never saw, so it learns the student's errors on
# new scenes). Its data stores, beside each preset's ground truth, its mean over the courtyard turned
# by 0/90/180/270 degrees (sun_turns 4), and the refiner fits that mean (target turned): a new scene's
# G-buffers do not say which walls face the sun
$AF --quiet train data --config $C/data-refiner.json
$AF --quiet train refiner --config $C/refiner.json
# trained on 8 wordings per preset, the student's and the refiner's prompt MLPs scattered the wordings they
# never saw (the held-out bright_sunny paraphrase read like autumn_warm and rendered warm): text-anchor
# refits only those MLPs, so each preset's training wordings, 16 more (the refiner and anchor prompt splits)
# and a noisy shell around them give the preset's mean response; then export the anchored pair
$AF --quiet train text-anchor --config $C/text-anchor.json
$AF --quiet train export --config $C/export.json --set student_run=runs/text-anchor --set refiner_run=runs/text-anchor
$AF --quiet train export --config $C/export.json --set student_run=runs/student-dmd --set codecs_run=runs/codecs --set out=runs/model-dmd
