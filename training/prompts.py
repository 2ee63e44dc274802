"""Prompts per lighting preset: the preset's own caption plus paraphrases, split train / held-out.

The G-buffer fixes what is in the scene; the prompt picks the lighting and mood. Each preset of
streaming/world/shading.py has 8 training wordings (its caption and TRAIN_PARAPHRASES) and 2
held-out ones (HELDOUT_PARAPHRASES), never seen in training: they measure whether the text
encoder (MiniLM sentence embeddings) carries meaning rather than memorised strings.

The default model's first two builds trained on the caption and the first two paraphrases only
(teacher config `train_wordings` still selects the first N; the recipe now uses all 8). With 3
points per preset the DiT's text projection fitted those points and the held-out paraphrases
landed between presets (62.5% of the third build's teacher's held-out renders nearest to the
prompted preset after 3,600 steps on 3; 81% after 2,000 more steps on all 8): more wordings cover
more of each preset's region of the embedding space.
"""
from __future__ import annotations

from ..streaming.world.shading import PRESETS

TRAIN_PARAPHRASES: dict[str, tuple[str, ...]] = {
    "bright_sunny": (
        "toys bouncing around a courtyard on a clear, sunny day at noon with sharp shadows",
        "a walled yard of colourful toys in strong midday sunshine, blue sky overhead",
        "a hot summer noon, dazzling sunlight and short dark shadows on the ground",
        "brilliant direct sunlight from a clear sky, saturated colours and high contrast",
        "playful objects in a courtyard basking in full daylight, not a cloud in sight",
        "the sun high overhead on a fine day, everything bright, warm and clearly lit",
        "clear weather at midday: strong sun, deep blue sky and well-defined shadows",
    ),
    "overcast": (
        "toys rolling in a courtyard on a dull grey cloudy day, soft even light",
        "a muted scene under thick clouds, diffuse lighting without sharp shadows",
        "a cloudy day with a heavy grey sky and soft, shadowless illumination",
        "grey weather, the sun hidden behind clouds, low contrast and quiet colours",
        "a gloomy cloud-covered sky spreading dim, uniform light over the yard",
        "soft diffuse daylight from a blanket of clouds, pale and neutral tones",
        "an overcast day: no direct sun, even grey light, muted and still",
    ),
    "sunset_dramatic": (
        "toys in a courtyard at dusk, a low orange sun casting long dramatic shadows",
        "golden hour at sunset with a purple and orange sky, cinematic warm light",
        "late evening as the sun goes down, fiery orange light and stretched shadows",
        "a blazing sunset, the sky streaked with orange, pink and purple",
        "sundown over the yard, warm red-gold rays raking in from the horizon",
        "dramatic dusk lighting, deep orange glow and a violet sky above",
        "the last light of the day, a low burning sun and long cinematic shadows",
    ),
    "moonlit_night": (
        "toys in a courtyard at night under pale blue moonlight, dark and quiet",
        "a dark nighttime scene lit only by the cold glow of the moon",
        "late at night, silvery moonlight and darkness all around",
        "a still night with a full moon casting cold blue light on the ground",
        "nocturnal scene, dim blue-grey moonlight and inky dark shadows",
        "the yard after dark, only the faint cold light of the moon",
        "a quiet blue night, moonlit and gloomy, almost no colour",
    ),
    "cyberpunk_neon": (
        "toys on a night street glowing with pink and blue neon signs in purple fog",
        "futuristic neon lighting, magenta and cyan glow through a violet haze",
        "a sci-fi city night, glowing pink and blue signs and purple smog",
        "vivid neon lights in magenta and cyan reflecting in a hazy dark street",
        "a synthwave night scene bathed in purple, pink and electric blue light",
        "a neon-lit urban night, bright fluorescent colours glowing in the mist",
        "cyberpunk atmosphere: violet fog, hot magenta and cyan neon glow",
    ),
    "snowy_winter": (
        "toys in a snowy courtyard on a cold winter day, pale sky and light mist",
        "a crisp wintry scene with cold bright sunlight and a hazy white sky",
        "a freezing winter day, white sky, bright cold light and thin fog",
        "snow season, pale cool daylight and a soft white haze in the air",
        "a chilly winter scene, icy bright light and a washed-out white sky",
        "cold clear winter light through light mist, everything pale and frosty",
        "a wintertime yard, frozen air, pale bluish-white light and haze",
    ),
    "autumn_warm": (
        "toys in a courtyard in warm amber autumn light late in the afternoon",
        "a cosy fall afternoon, golden-orange sunlight and warm tones",
        "autumn afternoon sun, rich amber light and soft warm shadows",
        "a warm fall day, the light golden and mellow, brown and orange hues",
        "late afternoon in autumn, sunlight the colour of honey and amber",
        "a golden autumn scene, warm low sunlight and earthy warm colours",
        "mellow fall light in the late afternoon, warm yellow-orange glow",
    ),
    "underwater": (
        "toys on the sea floor, blue-green light filtering down through the water",
        "an underwater scene with teal light and murky aquatic haze",
        "beneath the waves, aqua light and a hazy blue-green tint over everything",
        "on the ocean bottom, sunlight filtered through water into turquoise hues",
        "a submerged world in cyan and green, soft rays from the surface above",
        "under the sea, murky teal water and diffuse blue-green light",
        "at the bottom of a lagoon, everything tinted aquamarine by the water",
    ),
}

HELDOUT_PARAPHRASES: dict[str, tuple[str, ...]] = {
    "bright_sunny": (
        "cheerful bright daylight: hard sun from high above, vivid colours and crisp shade",
        "a sunlit courtyard under a cloudless sky, harsh noon light, bold colours",
    ),
    "overcast": (
        "flat, shadowless light from a grey sky over a walled yard of toys",
        "an overcast afternoon, gentle soft light and subdued colours, calm mood",
    ),
    "sunset_dramatic": (
        "the sun setting on the horizon bathes the yard in deep gold and long shadows",
        "evening twilight, the sky glowing orange and violet, a dramatic low sun",
    ),
    "moonlit_night": (
        "midnight in a walled yard, faint bluish moonlight and deep shadows",
        "a mysterious moonlit night, dim cool light under a black sky",
    ),
    "cyberpunk_neon": (
        "an electric cyberpunk night lit by bright neon tubes in hazy purple air",
        "a city alley at night drenched in hot pink and teal neon light",
    ),
    "snowy_winter": (
        "frosty winter daylight, misty air and a pale, icy atmosphere",
        "a serene snowy morning, cool white light and soft fog over the yard",
    ),
    "autumn_warm": (
        "late-day autumn sunshine giving everything a warm honey-coloured glow",
        "a nostalgic autumn scene bathed in soft amber afternoon sun",
    ),
    "underwater": (
        "submerged beneath the ocean surface, dreamy cyan-green light from above",
        "deep underwater, everything tinted blue and green by the surrounding water",
    ),
}


# Paraphrases only the refiner stage sees: the student renders with them as with a wording it never
# trained on (as it renders a user's), and the refiner learns to correct that render, reading the
# same wording. Written apart from both lists above; the held-out ones stay unseen by every stage.
REFINER_PARAPHRASES: dict[str, tuple[str, ...]] = {
    "bright_sunny": (
        "a glorious summer afternoon, blazing sunshine on a yard full of toys",
        "strong daylight pouring down from a spotless blue sky, everything sharp and colourful",
        "sunny and clear, intense white sunlight and dark, well-defined shadows",
        "a radiant day outdoors, the sun beating down on bright playthings",
        "midday glare, a vivid blue sky and toys lit by direct sunshine",
        "fair weather and full sun, lively saturated colours in the courtyard",
    ),
    "overcast": (
        "a dreary day, thick grey cloud cover and dull, even lighting",
        "cloudy skies, soft light with no visible sun and muted tones",
        "a grey, sunless day with diffuse pale light over the toys",
        "heavy clouds overhead, a subdued and colourless daytime scene",
        "an ashen sky giving soft, uniform light and faint shadows",
        "quiet grey weather, low-contrast daylight filtered through clouds",
    ),
    "sunset_dramatic": (
        "dusk falls, a crimson sun low on the horizon and a purple sky",
        "the end of the day, fiery orange sunlight skimming across the yard",
        "a cinematic sunset with pink clouds and shadows stretching far",
        "low evening sun, red and gold light, the sky turning violet",
        "sunset glow, burnt orange light and a moody magenta sky",
        "nightfall approaching, a setting sun painting the toys orange and red",
    ),
    "moonlit_night": (
        "a cold night, the courtyard lit by a pale moon in a dark sky",
        "darkness with soft silvery-blue moonlight on the toys",
        "night time, a bright moon and deep blue shadows everywhere",
        "a hushed night scene, faint moon glow and almost black surroundings",
        "under the moon at night, cool dim light and muted blue tones",
        "a lonely moonlit yard, icy blue light and heavy darkness",
    ),
    "cyberpunk_neon": (
        "glowing neon in pink and cyan cutting through a violet mist at night",
        "a dystopian night lit by magenta and turquoise neon signs",
        "rain-slick future streets, purple smog and bright neon glow",
        "night-time neon, hot magenta, electric cyan and smoky purple air",
        "a futuristic nightscape awash in fluorescent pink and blue light",
        "retro-future neon, magenta and aqua lights in a hazy night",
    ),
    "snowy_winter": (
        "a wintry courtyard, cold pale light and a misty white sky",
        "deep winter, bright icy daylight and a faint haze",
        "a frozen morning with white light and cold fog in the air",
        "snowy weather, cool bright light and a pale washed-out sky",
        "a cold, clear winter day with soft mist and frosty tones",
        "midwinter light, pale blue-white and hazy over the toys",
    ),
    "autumn_warm": (
        "a golden autumn afternoon, warm amber sunlight on the toys",
        "fall colours and mellow orange light late in the day",
        "an autumn day with syrupy golden sunlight and cosy warm tones",
        "warm autumnal light, golden and soft, in the late afternoon",
        "a cosy fall scene, amber rays and rich orange-brown hues",
        "late afternoon in fall, low warm sun and a golden cast",
    ),
    "underwater": (
        "under the sea, blue-green water with light shafts slanting down",
        "an aquatic scene, toys under water in a cyan and green haze",
        "the ocean floor, turquoise light and murky water all around",
        "a watery depth where teal and aqua colour every surface",
        "sunken toys lit by rippling blue-green light through the water",
        "an underwater courtyard, hazy sea-green light and dim depths",
    ),
}

# Paraphrases only `train text-anchor` reads (as extra wordings beside the `refiner` split's): the
# more wordings per preset its prompt MLPs are fitted on, the nearer an unseen one lands to its
# preset. Written apart from every list above; the held-out ones stay unseen by every stage.
ANCHOR_PARAPHRASES: dict[str, tuple[str, ...]] = {
    "bright_sunny": (
        "a bright day in the yard, the sun overhead and shadows pooled under the toys",
        "full summer sun, a clean blue sky and vivid playthings",
        "daylight at its strongest, white sunshine and sharp dark shade",
        "a cloud-free noon, strong light falling straight down on the courtyard",
        "glaring sunshine, bright surfaces and short crisp shadows",
        "a beautiful clear day, intense sunlight and saturated colours",
        "the middle of a sunny day, blue sky and hard-edged shadows",
        "toys under a blazing high sun on a perfect summer day",
        "sun-drenched courtyard at lunchtime, clear skies",
        "strong direct daylight, high contrast and brilliant colour",
    ),
    "overcast": (
        "a flat grey day, the whole sky one sheet of cloud",
        "dim cloudy light, everything soft and without shadows",
        "the sun lost behind grey cloud, muted colours in the yard",
        "a drab cloudy afternoon, even and diffuse light",
        "thick cloud cover, pale grey light and no contrast",
        "a colourless, cloudy day with gentle uniform lighting",
        "grey skies and soft light, the toys looking dull",
        "a heavy overcast sky, shadowless and cool",
        "cloud-filtered daylight, soft, grey and calm",
        "a sunless grey sky over the courtyard, low contrast",
    ),
    "sunset_dramatic": (
        "the sun sinking low, orange light and very long shadows",
        "a red and gold sunset over the courtyard, purple sky",
        "evening glow, deep orange light raking across the toys",
        "golden-orange dusk with a vivid violet and pink sky",
        "sundown, warm fiery light from the horizon",
        "a dramatic orange sky at the end of the day",
        "the setting sun throws long shadows in burning orange",
        "dusk light, crimson and amber under a purple sky",
        "a spectacular sunset, rich orange and magenta tones",
        "low sun at day's end, cinematic orange glow",
    ),
    "moonlit_night": (
        "a dark night, pale blue moonlight on the courtyard",
        "moonlight only, cold and blue, deep black shadows",
        "nighttime in the yard, a full moon and dim silver light",
        "a quiet moonlit scene, dark blue tones and little colour",
        "the middle of the night, cool faint moonlight",
        "dark and still, lit only by a cold moon",
        "a night scene in blue-grey moonlight, very dim",
        "the courtyard at night under a bright moon",
        "cold moonlit darkness, muted navy tones",
        "late night, soft blue moonbeams and darkness",
    ),
    "cyberpunk_neon": (
        "pink and cyan neon glowing through purple haze at night",
        "a neon-drenched night, magenta and teal light everywhere",
        "futuristic city glow, hot pink and electric blue",
        "violet fog lit by bright neon signs",
        "a cyber night, glowing magenta and aqua lights",
        "neon tubes casting pink and blue light in a dark hazy street",
        "synthwave colours, purple mist and neon glow",
        "a night lit by fluorescent pink and cyan signs",
        "electric neon night, hazy purple air",
        "a sci-fi alley glowing magenta and turquoise",
    ),
    "snowy_winter": (
        "a snowy day, pale cold light and white haze",
        "winter light, cool and bright, with a misty white sky",
        "a frosty courtyard under a pale, hazy sky",
        "cold winter daylight, soft fog and icy tones",
        "a white wintry scene, bright and chilly",
        "mist and snow, cold bluish-white light",
        "an icy winter day with a washed-out white sky",
        "pale frozen daylight and a thin white fog",
        "the cold light of a snowy morning",
        "wintertime haze, pale and cold colours",
    ),
    "autumn_warm": (
        "autumn light, warm amber and golden tones",
        "a mellow fall afternoon, honey-gold sunlight",
        "warm golden light of an autumn day",
        "soft amber sun in the late afternoon in fall",
        "fall sunshine, orange and brown warm hues",
        "a cosy autumn afternoon glowing gold",
        "late autumn sun, warm and low, golden colours",
        "amber autumnal light over the courtyard",
        "a golden fall day, warm soft shadows",
        "warm honey-coloured sunlight in autumn",
    ),
    "underwater": (
        "underwater, blue-green light filtering from above",
        "a sunken courtyard in teal water, hazy and dim",
        "deep in the sea, aqua light and murky haze",
        "beneath the water, everything tinted cyan and green",
        "an ocean-floor scene, turquoise light and soft rays",
        "submerged toys in green-blue murky water",
        "underwater light, teal haze and dappled rays",
        "the sea bottom, aquamarine water all around",
        "a watery blue-green world, dim and hazy",
        "under the sea, cyan light and floating haze",
    ),
}

# World v2's own presets (streaming/world/traced/presets.py): the same four splits, written apart.
WORLD_V2_PARAPHRASES: dict[str, dict[str, tuple[str, ...]]] = {
    "rainy_wet": {
        "train": (
            "a street just after rain, wet asphalt shining with puddles under a grey sky",
            "rain-soaked ground, glossy and dark, reflecting the buildings and the pale sky",
            "a wet day: everything damp, puddles mirroring the light, low grey clouds",
            "after a downpour the pavement gleams, surfaces dark and slick with water",
            "grey rainy weather, shiny wet stone and asphalt with soft reflections",
            "a drizzly afternoon, the ground glistening and the colours deepened by the rain",
            "overcast and wet, reflections of lights and walls on the rain-slicked ground",
        ),
        "heldout": (
            "the streets still dripping from a shower, slick reflective ground under heavy cloud",
            "a soggy grey day with mirror-like puddles and darkened, glossy surfaces",
        ),
        "refiner": (
            "wet weather, the floor of the scene reflective after the rain",
            "a rainy scene with gleaming puddles and a dull grey sky",
            "damp surfaces shining softly under a cloudy sky after rainfall",
            "rain has just stopped: slick ground, grey light, glossy reflections",
            "a moist, moody day with the ground polished by rain",
            "grey drizzle, the paving dark and wet, reflections everywhere",
        ),
        "anchor": (
            "rainy and wet", "wet ground after the rain", "puddles and reflections on a grey day",
            "a slick rain-washed scene", "glossy wet paving under clouds", "the world soaked by rain",
            "shiny wet streets", "after the storm, everything wet", "a damp overcast afternoon",
            "rain-darkened surfaces with reflections",
        ),
    },
    "foggy": {
        "train": (
            "a scene lost in dense fog, far buildings fading into soft grey",
            "thick mist hanging in the air, shapes dissolving with distance",
            "a foggy morning, pale haze swallowing everything beyond a few metres",
            "heavy fog and diffuse light, a quiet, muffled world in grey-white",
            "mist everywhere: near things clear, distant things ghostly and pale",
            "a hazy, fog-bound place where the background melts into white",
            "dense low cloud at ground level, soft light and vanishing distances",
        ),
        "heldout": (
            "a milky fog drifting through, distant walls barely visible",
            "visibility down to a few metres in a thick grey mist",
        ),
        "refiner": (
            "fog rolling in, distant objects washed out to grey",
            "a misty scene with soft light and faded depth",
            "pale fog filling the space, the far end invisible",
            "a cloudy haze at ground level, everything softened",
            "murky grey fog, near objects clear and far ones gone",
            "quiet misty weather with no hard shadows",
        ),
        "anchor": (
            "foggy", "thick fog", "a misty morning", "grey haze everywhere", "dense mist",
            "fog swallowing the distance", "a fog-bound scene", "soft white fog", "low visibility in the mist",
            "a hazy grey world",
        ),
    },
    "night_lamps": {
        "train": (
            "a night scene lit by warm street lamps, pools of yellow light in the dark",
            "after dark, glowing lamps casting warm circles of light on the ground",
            "nighttime with lamplight: golden glows against a black sky",
            "a dark evening where only the lamps light the scene, warm and orange",
            "lamps burning at night, soft yellow light and deep shadows between them",
            "the scene at night under warm artificial light, the sky nearly black",
            "night-time, warm lamp glow on walls and ground, darkness beyond",
        ),
        "heldout": (
            "a late evening lit by glowing yellow lanterns, the rest in darkness",
            "warm electric light from lamps in the middle of the night",
        ),
        "refiner": (
            "night with warm lamps shining", "dark surroundings lit by yellow lamplight",
            "glowing lamps at night, warm light and black sky", "an evening scene under lamp light",
            "night, golden lamps and long dark shadows", "warm lights in the dark of night",
        ),
        "anchor": (
            "night with lamps", "lamplight at night", "warm lamps in the dark", "street lamps glowing",
            "yellow lamp light", "a lamp-lit night", "night lit by lamps", "glowing lights after dark",
            "warm light pools at night", "a dark night with lamps on",
        ),
    },
}

SPLITS = ("train", "heldout", "refiner", "anchor")


def prompts(preset: str, split: str) -> list[str]:
    """Wordings of a preset for split 'train' (its caption first, then TRAIN_PARAPHRASES), 'heldout',
    'refiner' (REFINER_PARAPHRASES) or 'anchor' (ANCHOR_PARAPHRASES)."""
    if preset in WORLD_V2_PARAPHRASES:
        from ..streaming.world.traced.presets import TRACED_PRESETS

        if split not in SPLITS:
            raise ValueError(f"prompt split {split!r} is not one of {', '.join(SPLITS)}")
        caption = [TRACED_PRESETS[preset].prompt] if split == "train" else []
        return caption + list(WORLD_V2_PARAPHRASES[preset][split])
    if split == "train":
        return [PRESETS[preset].prompt, *TRAIN_PARAPHRASES[preset]]
    if split == "heldout":
        return list(HELDOUT_PARAPHRASES[preset])
    if split == "refiner":
        return list(REFINER_PARAPHRASES[preset])
    if split == "anchor":
        return list(ANCHOR_PARAPHRASES[preset])
    raise ValueError(f"prompt split {split!r} is not one of {', '.join(SPLITS)}")
