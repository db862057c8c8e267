//! Words for line names (`<adjective>-<noun>`). Their last fifth is held out of training; the
//! fresh lists are in no other list (held out too, for longer held-out records).

pub(crate) const ADJECTIVES: &[&str] = &[
    "able", "acid", "aged", "airy", "amber", "ample", "azure", "bald", "bare", "basic", "bold",
    "brave", "brief", "bright", "brisk", "broad", "calm", "cheap", "chief", "civil", "clean",
    "clear", "close", "cool", "cozy", "crisp", "curly", "damp", "dark", "dear", "deep", "dense",
    "dizzy", "dry", "dull", "eager", "early", "easy", "empty", "equal", "exact", "faint", "fair",
    "fancy", "fast", "fierce", "fine", "firm", "flat", "fond", "frank", "free", "fresh", "full",
    "funny", "giant", "glad", "gold", "grand", "great", "green", "grey", "happy", "hard", "harsh",
    "heavy", "high", "hollow", "huge", "icy", "ideal", "jolly", "keen", "kind", "large", "late",
    "lazy", "light", "little", "livid", "long", "loud", "lucky", "mild", "misty", "modest",
    "moist", "noble", "odd", "pale", "plain", "polite", "proud", "quick", "quiet", "rapid", "rare",
    "rich", "rough", "royal", "rusty", "safe",
];

pub(crate) const NOUNS: &[&str] = &[
    "acorn", "anchor", "apple", "arrow", "badge", "bagel", "banjo", "barn", "basket", "beacon",
    "bell", "bench", "berry", "blade", "blanket", "boat", "bottle", "branch", "bread", "brick",
    "bridge", "brook", "brush", "bucket", "button", "cabin", "cable", "camel", "candle", "canoe",
    "canyon", "carpet", "castle", "cedar", "chair", "chalk", "cherry", "circle", "cliff", "clock",
    "cloud", "clover", "coast", "comet", "copper", "coral", "cotton", "crane", "crown", "daisy",
    "desert", "dragon", "drum", "eagle", "ember", "engine", "falcon", "feather", "fern", "field",
    "flame", "flute", "forest", "fossil", "garden", "gate", "glacier", "globe", "grape", "harbor",
    "hammer", "hazel", "helmet", "honey", "island", "jacket", "jewel", "kettle", "ladder",
    "lantern", "lemon", "lily", "magnet", "maple", "meadow", "mirror", "monkey", "needle", "ocean",
    "orchid", "otter", "paddle", "pebble", "pepper", "piano", "pillow", "planet", "pocket",
    "quartz", "rabbit", "ribbon",
];

/// Words in no other list, for held-out records longer than the held-out fifth allows (its 21 × 21
/// names): 40 × 40 more names, never seen in training.
pub(crate) const FRESH_ADJECTIVES: &[&str] = &[
    "agile", "blunt", "bumpy", "chilly", "cloudy", "coarse", "crafty", "dainty", "dusty", "fluffy",
    "frosty", "fuzzy", "gentle", "glossy", "grassy", "hasty", "hearty", "humble", "husky",
    "jagged", "lanky", "leafy", "lofty", "mellow", "murky", "nimble", "plump", "rocky", "sandy",
    "shiny", "silky", "snowy", "soggy", "spicy", "stormy", "sunny", "tidy", "vivid", "windy",
    "witty",
];

/// See [`FRESH_ADJECTIVES`].
pub(crate) const FRESH_NOUNS: &[&str] = &[
    "walnut", "violin", "tulip", "turtle", "trumpet", "tractor", "teapot", "sparrow", "spoon",
    "squirrel", "statue", "tunnel", "saddle", "rocket", "robin", "pumpkin", "puzzle", "pyramid",
    "parrot", "peacock", "penguin", "pencil", "orange", "onion", "noodle", "mitten", "marble",
    "lobster", "lizard", "kiwi", "kayak", "igloo", "hedgehog", "gorilla", "goblet", "funnel",
    "fiddle", "dolphin", "donkey", "compass",
];
