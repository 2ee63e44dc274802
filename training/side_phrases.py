"""How prompts name the sun's side, for the light head (training/light_head.py).

Training phrases come from a small grammar: a subject ("the sun", "light coming", ...) with a
position ("ahead of {ref}", "on {poss} left", "from behind {ref}", ...), or a side's own idiom
("backlit", "front-lit", "our back to the sun"), then sometimes a tail. Each side's phrases use the
same subjects, references (camera, viewer, us, ...), adverbs and tails, so the words that tell the
side apart are the only words tied to it: with a handful of fixed phrases per side the head learnt
incidental words instead ("viewer" appeared only in behind phrases, and "the sun straight ahead of
the viewer" read as behind). None of the held-out phrases (HELDOUT) is ever generated, and no
training phrase uses the words "photographer" or "lens".
"""
from __future__ import annotations

import random

SIDES = ("ahead", "left", "behind", "right")
# (object, possessive): whom the side is relative to
REFERENCES = (("the camera", "the camera's"), ("the viewer", "the viewer's"), ("us", "our"), ("me", "my"),
              ("the observer", "the observer's"), ("the onlooker", "the onlooker's"))
# A subject, then a place (where the light is) ... ("the {light}" twice: the plainest form, drawn more often)
AT_SUBJECTS = ("the {light}", "the {light}", "the {light} shining", "the {light} hanging", "the {light} sitting",
               "a bright {light}", "the {light} low", "the {light} high", "the {light} glowing")
AT = {
    "ahead": ("ahead", "up ahead", "straight ahead", "ahead of {ref}", "in front of {ref}",
              "directly in front of {ref}", "just in front of {ref}", "opposite {ref}", "facing {ref}",
              "in the sky ahead", "in the distance ahead", "in front", "ahead, facing {ref}",
              "in view ahead of {ref}", "far ahead", "far ahead of {ref}", "directly ahead",
              "ahead, in {poss} field of view", "on the far side of the scene, facing {ref}"),
    "left": ("on the left", "to the left", "on {poss} left", "to {poss} left", "to the left of {ref}",
             "left of {ref}", "on the left-hand side", "over on the left", "far on the left",
             "in the sky to the left", "just to the left", "on the left of the scene", "at the left",
             "on the left of {ref}", "straight to the left of {ref}", "directly to the left of {ref}",
             "directly on {poss} left", "out of view on the left"),
    "behind": ("behind", "behind {ref}", "directly behind {ref}", "just behind {ref}", "over {poss} shoulder",
               "to the rear of {ref}", "back behind {ref}", "in the sky behind {ref}", "out of view behind {ref}",
               "at the viewer's back", "behind the camera", "far behind {ref}", "in back of {ref}",
               "behind, out of frame", "straight behind {ref}", "directly behind",
               "on {poss} side of the scene, behind {ref}"),
    "right": ("on the right", "to the right", "on {poss} right", "to {poss} right", "to the right of {ref}",
              "right of {ref}", "on the right-hand side", "over on the right", "far on the right",
              "in the sky to the right", "just to the right", "on the right of the scene", "at the right",
              "on the right of {ref}", "straight to the right of {ref}", "directly to the right of {ref}",
              "directly on {poss} right", "out of view on the right"),
}
# ... or a subject, then where the light comes from
FROM_SUBJECTS = ("light coming", "{light}light pouring in", "lit", "light arriving", "the {light} shining",
                 "{light}light", "bright light", "{light}light spilling")
FROM = {
    "ahead": ("from ahead", "from straight ahead", "from in front of {ref}", "from directly ahead",
              "from ahead, towards {ref}", "from in front", "from up ahead", "from far ahead",
              "from ahead, into {poss} view"),
    "left": ("from the left", "from {poss} left", "from the left of {ref}", "from the left-hand side",
             "in from the left", "from the left side", "from far on the left", "from straight to the left",
             "from directly left of {ref}"),
    "behind": ("from behind {ref}", "from behind", "from directly behind {ref}", "from over {poss} shoulder",
               "from the rear", "from behind the camera", "from back behind {ref}", "from straight behind {ref}",
               "from far behind"),
    "right": ("from the right", "from {poss} right", "from the right of {ref}", "from the right-hand side",
              "in from the right", "from the right side", "from far on the right", "from straight to the right",
              "from directly right of {ref}"),
}
# Whole phrases a side has of its own
IDIOMS = {
    "ahead": ("backlit by the {light} ahead", "back-lit, the {light} in front of {ref}", "facing the {light}",
              "looking into the {light}", "the camera facing the {light}",
              "against the {light}, everything in silhouette", "shapes silhouetted against the {light}",
              "the camera pointed at the {light}", "into the glare of the {light}", "contre-jour, the {light} ahead",
              "the {light} ahead, shadows reaching towards {ref}",
              "with the {light} ahead, shining towards the camera", "the {light} in the frame, facing {ref}"),
    "left": ("lit from the left side", "side-lit from the left", "the left side lit by the {light}",
             "{light}light from the left", "the {light} low on the left, shadows reaching towards the right",
             "with the {light} on the left", "the {light} on the left-hand side", "the {light} over on the left",
             "the {light} in the frame, on the left"),
    "behind": ("front-lit by the {light} behind {ref}", "with {poss} back to the {light}",
               "{poss} back to the {light}", "facing away from the {light}", "looking away from the {light}",
               "the camera pointed away from the {light}", "lit from behind the camera",
               "light shining towards the scene from behind {ref}",
               "the {light} behind {ref}, shadows reaching away from {ref}", "with the {light} behind the camera",
               "front-lit, the {light} behind {ref}", "the {light} out of the frame, behind {ref}"),
    "right": ("lit from the right side", "side-lit from the right", "the right side lit by the {light}",
              "{light}light from the right", "the {light} low on the right, shadows reaching towards the left",
              "with the {light} on the right", "the {light} on the right-hand side", "the {light} over on the right",
              "the {light} in the frame, on the right"),
}
# After any side's phrase, or a wording that names no side: words that say nothing of the side
TAILS = ("crisp shadows on the ground", "long shadows across the ground", "the whole scene in view",
         "as seen by {ref}", "the camera moving slowly", "clear light", "shadows soft at the edges",
         "the horizon far away", "shadows turning towards the light")
NEUTRAL = ("seen by {ref}", "from {poss} point of view", "the camera moving slowly", "with {ref} looking on",
           "the viewer standing in the scene", "the camera at eye level", "shadows across the ground")

# Never trained on: what a user might write instead (six a side; none is generated above).
HELDOUT = {
    "ahead": ("backlit, the {light} straight ahead of the viewer", "shooting straight into the {light}",
              "the {light} dead ahead, shining in our eyes",
              "the {light} in front of the lens, shadows falling towards us",
              "the {light} facing the viewer from across the scene",
              "the {light} straight in front of us, shapes dark against it"),
    "left": ("the {light} low on our left", "light falling in from the left-hand side", "the {light} off to the left",
             "the {light} to the viewer's left", "light streaming in from the left of the frame",
             "the {light} on the left side of the picture"),
    "behind": ("the {light} at our backs", "the {light} shining from behind the viewer",
               "the {light} behind the photographer",
               "the {light} over our shoulders, shadows stretching away from us",
               "the {light} at the camera's back, everything lit head-on",
               "the {light} coming from behind where we stand"),
    "right": ("the {light} off to the right", "light falling in from the right-hand side",
              "the {light} low on our right", "the {light} to the viewer's right",
              "light streaming in from the right of the frame", "the {light} on the right side of the picture"),
}


def _fill(template: str, light: str, rng: random.Random) -> str:
    ref, poss = rng.choice(REFERENCES)
    return template.format(light=light, ref=ref, poss=poss)


def _heldout(light: str) -> list[str]:
    return [p.format(light=light) for side in SIDES for p in HELDOUT[side]]


def side_phrase(side: str, light: str, rng: random.Random) -> str:
    """One training phrase naming `side` for a light called `light` (sun, moon), never a held-out one."""
    heldout = _heldout(light)
    while True:
        pick = rng.random()
        if pick < 0.3:
            phrase = _fill(rng.choice(IDIOMS[side]), light, rng)
        elif pick < 0.7:
            phrase = _fill(f"{rng.choice(AT_SUBJECTS)} {rng.choice(AT[side])}", light, rng)
        else:
            phrase = _fill(f"{rng.choice(FROM_SUBJECTS)} {rng.choice(FROM[side])}", light, rng)
        if rng.random() < 0.25:
            phrase += ", " + _fill(rng.choice(TAILS), light, rng)
        if not any(h in phrase for h in heldout):
            return phrase


def neutral_phrase(rng: random.Random) -> str:
    """A clause that names no side (the camera, the viewer, shadows), for texts whose side is 'none'."""
    return _fill(rng.choice(NEUTRAL), "", rng)
