"""Small hand-written word lists for keys and fictional names (no external word list needed)."""

ADJECTIVES = (
    "amber azure brisk calm crimson dusty eager faint gentle hollow icy jolly keen lively "
    "mellow nimble olive proud quiet rapid rustic silver tidy upbeat vivid wary woolly young "
    "zesty bold clever dapper earnest fancy grand humble ivory jagged kindly lofty misty noble "
    "orange plain quaint rosy sturdy tawny velvet wintry"
).split()

NOUNS = (
    "anchor badger beacon candle cactus dolphin ember falcon garden harbor igloo jacket kettle "
    "lantern meadow needle orchard pebble quilt raven saddle teapot umbrella violin walnut "
    "yacht zebra acorn bridge castle dagger engine feather goblet helmet island journal kayak "
    "ladder mirror nectar oyster parrot quarry ribbon spindle trumpet"
).split()

SYLLABLES = (
    "ka lo mi ra ven tor bel dun ash wyn cor fel gar hal isk jor lun mar nor pel quin rhos "
    "sel tam ul var wen yor zel bri cad dre"
).split()

FIRST_NAMES = (
    "Alba Bren Cato Dara Elio Fenna Galen Hesper Ines Joren Kestra Lio Maren Nilo Orla Pim "
    "Quilla Rolan Sefa Tamsin Ulric Vesna Wren Yara Zev"
).split()
