"""Write the benchmark workloads shipped in resources/workloads/ (chat, rag, code).

All text here was written for this project (the RAG passages describe an invented valley), so
the prompt sets can be shipped and redistributed freely. Output lengths follow what these
tasks produce in practice: a few hundred tokens for a chat answer or a code completion, a
short grounded answer for RAG. Run `python benchmarks/make_workloads.py` after editing.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "resources" / "workloads"

CHAT = [
    ("What is the difference between a list and a tuple in Python?", 256),
    ("Give me three ideas for a quick vegetarian dinner on a weeknight.", 320),
    ("Explain why the sky is blue to a ten-year-old.", 200),
    ("How do I politely decline a meeting invitation from my manager?", 240),
    ("Summarise the main causes of the French Revolution in a few sentences.", 300),
    ("What should I pack for a three-day hiking trip in autumn?", 320),
    ("Write a short, friendly message congratulating a colleague on a promotion.", 128),
    ("What is a good way to start learning to play the guitar as an adult?", 300),
    ("Explain compound interest with a simple example.", 256),
    ("How can I improve my sleep if I work night shifts?", 320),
    ("What are the pros and cons of working from home?", 300),
    ("Translate 'Where is the train station?' into French, Spanish and German.", 96),
    ("Suggest a name for a small bakery that specialises in sourdough bread.", 128),
    ("How does a refrigerator keep food cold?", 256),
    ("Write a haiku about the first snow of winter.", 64),
    ("What is the capital of Australia, and why is it not Sydney?", 160),
    ("Give me a two-week plan to start running three times a week.", 384),
    ("How do vaccines train the immune system?", 300),
    ("What questions should I ask when viewing a flat to rent?", 320),
    ("Explain the rules of chess castling briefly.", 200),
    ("Write a polite email asking a landlord to fix a leaking tap.", 220),
    ("What are some tips for keeping houseplants alive in a dark room?", 280),
    ("Why do leaves change colour in autumn?", 220),
    ("Compare electric cars and petrol cars for a family that drives 50 km a day.", 360),
]

CODE = [
    (
        "Complete this Python function:\n\n```python\ndef is_palindrome(s: str) -> bool:\n"
        '    """Return True if s reads the same forwards and backwards, ignoring case and '
        'non-letters."""\n```',
        200,
    ),
    (
        "Write a Python function that merges two sorted lists into one sorted list without "
        "using sort().",
        256,
    ),
    (
        "Complete the JavaScript function:\n\n```javascript\n// Debounce: call fn only after "
        "`wait` ms have passed without another call.\nfunction debounce(fn, wait) {\n```",
        220,
    ),
    (
        "Write a SQL query that returns the five customers with the highest total order value "
        "from tables customers(id, name) and orders(id, customer_id, amount).",
        200,
    ),
    (
        "Implement a stack class in Python with push, pop, peek and is_empty, with type hints "
        "and docstrings.",
        360,
    ),
    (
        "Complete this Rust function:\n\n```rust\n/// Count how often each word occurs in "
        "`text`.\nfn word_counts(text: &str) -> std::collections::HashMap<String, usize> {\n```",
        300,
    ),
    (
        "Write a bash script that finds all .log files older than 7 days under /var/log/myapp "
        "and compresses them with gzip.",
        220,
    ),
    (
        "Write a Python function that reads a CSV file and returns the average of a numeric "
        "column given by name, skipping empty cells.",
        300,
    ),
    (
        "Complete the Go function:\n\n```go\n// Reverse returns s with its runes in reverse "
        "order.\nfunc Reverse(s string) string {\n```",
        160,
    ),
    (
        "Write a unit test with pytest for a function add(a, b) that covers integers, floats "
        "and a TypeError for strings.",
        300,
    ),
    ("Implement binary search in C over a sorted int array; return the index or -1.", 256),
    ("Write a Python class LRUCache with get and put in O(1) using OrderedDict.", 360),
    (
        "Complete this TypeScript interface and a function that validates it:\n\n```typescript\n"
        "interface User {\n  id: number;\n  email: string;\n```",
        320,
    ),
    ("Write a Python generator that yields the Fibonacci numbers below a limit.", 160),
    (
        "Write a Dockerfile for a small Python web app that uses requirements.txt and runs "
        "gunicorn on port 8000.",
        240,
    ),
    (
        "Explain and fix the bug:\n\n```python\ndef average(xs):\n    total = 0\n    for x in xs:"
        "\n        total += x\n    return total / len(x)\n```",
        256,
    ),
]

PASSAGES = [
    "The Harrowmere Valley lies between two long ridges of grey limestone, the Old Shoulder "
    "to the west and the Tarn Edge to the east. The valley floor is about eleven kilometres "
    "long and rarely more than two kilometres wide. Its only river, the Mere Water, rises in "
    "a bog below the northern pass and flows south through three villages before joining "
    "the larger Cawl river at the market town of Brindle Cross. Most of the farmland lies "
    "on the eastern bank, where the soil is deeper and the afternoon sun lingers longer "
    "than on the steep western slopes.",
    "The first written record of the valley is a boundary charter of the year 1142, which "
    "granted the upland pastures to the priory at Brindle Cross. The charter names a "
    "'stone at the head of the water' as the northern limit, and local historians believe "
    "this is the standing stone now called the Grey Maid, which still stands beside the "
    "footpath to the pass. The priory kept sheep on the high ground for almost four "
    "centuries, and the dry-stone walls that divide the upper fields were mostly built by "
    "its tenants between 1300 and 1500.",
    "Upper Harrow, the northernmost village, grew up around a fulling mill where woollen "
    "cloth was beaten and washed in the fast water below the bog. The mill closed in 1871, "
    "and its wheel pit can still be seen behind the Weavers' Arms. The village has a "
    "population of roughly 340 people today. Its school was merged with the school in "
    "Middle Harrow in 1968, and the old schoolroom now serves as the village hall, where "
    "the parish council meets on the first Tuesday of every month.",
    "Middle Harrow is the largest of the three villages, with about 1,100 residents, a "
    "doctor's surgery, a primary school and the valley's only petrol station. The church of "
    "Saint Aldric has a squat tower from the twelfth century and a nave rebuilt after a "
    "fire in 1702. Inside, a carved oak screen shows the months of the year as farming "
    "tasks: ploughing in March, shearing in June, harvest in August and the killing of the "
    "pig in December. Visitors often ask why October is shown as a man mending a wall.",
    "Nether Harrow, at the southern end, was a quarrying village. Limestone from the Tarn "
    "Edge was burned in kilns to make lime for mortar and for sweetening acid fields. Four "
    "kilns survive along the lane to the quarry, the best preserved being the double kiln "
    "at Sallow Bank, restored by volunteers in 2009. Quarrying stopped in 1954, when the "
    "company moved its work to a larger site beyond Brindle Cross. The flooded quarry is "
    "now a nature reserve, known for its dragonflies and for a colony of sand martins.",
    "The Harrowmere branch railway opened in 1889 to carry lime and stone to the main line "
    "at Brindle Cross. A passenger service of four trains a day followed in 1891. The line "
    "was single track, eleven and a half kilometres long, with stations at Nether Harrow "
    "and Middle Harrow and a goods siding at the quarry. Passenger trains were withdrawn "
    "in 1951 and the line closed completely in 1955, a year after the quarry. The trackbed "
    "between Middle Harrow and Brindle Cross is now a cycle path called the Limeway.",
    "The valley's water supply comes from the Tarn, a small upland lake above the Tarn "
    "Edge. A stone aqueduct built in 1903 carries water to a treatment works at Middle "
    "Harrow, which serves all three villages. The works was modernised in 1998 with sand "
    "filters and ultraviolet treatment. During the dry summer of 2018 the Tarn fell to its "
    "lowest level on record, and a hosepipe ban lasted for seven weeks. Since then the "
    "water company has repaired leaks that were losing about a fifth of the supply.",
    "Harrowmere cheese is a hard, crumbly cheese made from the milk of the valley's "
    "shorthorn cattle. The recipe was recorded by a dairymaid, Agnes Pell, in a notebook "
    "dated 1826 that is kept in the village hall at Upper Harrow. The cheese is pressed for "
    "two days, bound in cloth, and matured for at least five months in cool stone cellars. "
    "Two farms still make it by hand: Rookhow Farm and Low Garth. Together they produce "
    "around nine tonnes a year, most of it sold at the Brindle Cross market and by post.",
    "The Lantern Walk is held on the last Saturday of November. Children carry paper "
    "lanterns from the church in Middle Harrow to the Grey Maid stone, about four "
    "kilometres to the north, singing a song whose words are said to date from the "
    "seventeenth century. At the stone each child leaves a small gift of bread for 'the "
    "Maid', a custom explained in several competing local stories. Since 1990 the walk has "
    "finished with hot cider and parkin at the Weavers' Arms in Upper Harrow.",
    "The geology of the valley is dominated by Carboniferous limestone, laid down in a "
    "warm shallow sea about 340 million years ago. Fossil corals and crinoids are common "
    "in the walls and in the quarry spoil. Above the limestone on the Old Shoulder lies a "
    "cap of gritstone, a coarse sandstone that weathers into rounded boulders. Where "
    "water runs off the gritstone onto the limestone it has dissolved sinkholes, locally "
    "called 'swallows'. The largest, Hob's Swallow, swallows the whole of a small stream.",
    "Hob's Swallow leads into a cave system that has been explored for about 2.3 "
    "kilometres. The entrance pitch is a vertical drop of eighteen metres and should only "
    "be attempted by trained cavers with proper equipment. Below, a stream passage "
    "connects to a large chamber called the Cathedral, roughly forty metres long. Dye "
    "tracing in 1977 showed that the water reappears at a spring called Ebb Well, near "
    "Nether Harrow, about nine hours after it enters the swallow.",
    "The weather in the valley is wetter than in the lowlands around it. Middle Harrow "
    "receives about 1,450 millimetres of rain a year, with November and December the "
    "wettest months. Snow falls on around twenty days a winter on the higher ground but "
    "rarely lies for long on the valley floor. Cold air drains down from the pass on still "
    "nights, so frost is common in the bottom of the valley even in late May, and "
    "gardeners in Nether Harrow traditionally wait until June to plant out beans.",
    "Wildlife in Harrowmere includes red squirrels, which survive in the conifer plantation "
    "on the Old Shoulder, and otters, which returned to the Mere Water in the early 2000s "
    "after an absence of forty years. Dippers and grey wagtails feed along the river. The "
    "limestone grassland supports rare plants such as bird's-eye primrose and mountain "
    "pansy. The flooded quarry reserve is managed by a volunteer trust that counts its "
    "dragonflies every July; fourteen species were recorded in the most recent survey.",
    "The Weavers' Arms in Upper Harrow is the oldest inn in the valley. Its deeds go back "
    "to 1684, though parts of the building may be older. The inn served the packhorse "
    "traffic over the northern pass before the turnpike road was built in the valley "
    "bottom. A painted sign shows a weaver at a handloom. The current landlord brews a "
    "dark bitter called Fuller's Folly in a small brewhouse behind the inn, named after "
    "the fulling mill whose wheel pit lies a few metres away.",
    "The turnpike road through the valley was built between 1791 and 1796. It replaced "
    "the old packhorse route along the western slopes with a graded road on the valley "
    "floor. Tolls were collected at a cottage at the southern end of Middle Harrow, which "
    "still has a small window facing the road where the keeper took the money. Tolls were "
    "abolished in 1874. The road is now the B6230 and carries about 2,000 vehicles a day, "
    "rising to more than 5,000 on summer weekends.",
    "Harrowmere's population peaked at about 2,900 in the census of 1881, when the quarry "
    "and the lime kilns employed over three hundred men. It fell steadily in the twentieth "
    "century as farms merged and the quarry closed, reaching a low of 1,600 in 1971. "
    "Since then it has recovered slightly to around 1,750, helped by people who work from "
    "home and by retirement. About one house in seven in the valley is now a second home "
    "or a holiday let, a share that has caused debate at parish meetings.",
    "The Harrowmere Show takes place on the second Saturday of August in a field beside "
    "the river at Middle Harrow. It began in 1867 as a sheep show and now includes cattle, "
    "fell running, sheepdog trials, a vegetable competition and a class for the best "
    "dry-stone wall built on the day. The fell race climbs from the showfield to the summit "
    "cairn on the Old Shoulder and back, a distance of 6.5 kilometres with 420 metres of "
    "climb. The course record of 31 minutes 12 seconds was set in 2004.",
    "Electricity arrived in the valley late. Middle Harrow was connected to the grid in "
    "1938, but several outlying farms relied on their own water turbines or diesel "
    "generators until the early 1960s. Rookhow Farm still runs a small hydroelectric "
    "turbine on a beck that falls from the Old Shoulder; installed in 1931 and rebuilt in "
    "2012, it produces about 15 kilowatts in wet weather, enough for the farm and dairy "
    "with some to spare, which is sold to the grid.",
    "Broadband came to the valley in stages. Middle Harrow received a fibre cabinet in "
    "2015, giving speeds of about 40 megabits per second to most houses. Upper Harrow and "
    "the outlying farms were left behind until a community project, Harrowmere Connect, "
    "raised money to lay its own fibre in 2021. Volunteers dug many of the trenches "
    "themselves along field edges. The network now serves 212 properties with symmetric "
    "speeds of up to one gigabit per second, and is run as a cooperative.",
    "The Limeway cycle path follows the old railway from Middle Harrow to Brindle Cross, "
    "a distance of 8.2 kilometres. It is surfaced with compacted limestone dust and is "
    "suitable for families, wheelchairs and pushchairs. Its gradient never exceeds one in "
    "sixty, because the railway was built for heavy goods trains. Highlights include the "
    "five-arched Cawl viaduct and a short tunnel at Sallow Bank, lit by solar-powered "
    "lamps. Bicycles can be hired from the old station building at Middle Harrow.",
    "Flooding is the valley's most serious natural hazard. In January 1995 the Mere Water "
    "burst its banks after two days of heavy rain on melting snow, flooding forty houses "
    "in Nether Harrow to a depth of up to a metre. A flood defence scheme completed in "
    "2003 raised the riverbank, built a storage basin in the fields above the village and "
    "installed a river level gauge that sends warnings to residents' phones. The scheme "
    "was tested in December 2015 and held, though the basin filled almost to the top.",
    "Local government in the valley is shared between the Harrowmere Parish Council, "
    "which has nine elected members, and the district council at Brindle Cross. The parish "
    "council looks after footpaths, the village halls, the playing field and the three "
    "bus shelters, and it comments on planning applications. Its annual budget is about "
    "£38,000, raised through a precept on council tax. Recent projects include a new "
    "footbridge over the Mere Water at Upper Harrow and defibrillators in each village.",
]

QUESTIONS = [
    ("Why did the Harrowmere branch railway close, and what is its route used for now?", 220),
    ("How long after entering Hob's Swallow does the water reappear, and where?", 160),
    ("Describe how Harrowmere cheese is made and who makes it today.", 260),
    ("What happened during the flood of 1995, and how is the valley protected now?", 260),
    ("Compare the population of the valley in 1881, 1971 and today, and explain the changes.", 260),
    ("What is the Lantern Walk, and when and where does it take place?", 220),
    ("How does the valley get its water, and what happened in the summer of 2018?", 220),
    ("Which events are part of the Harrowmere Show, and what is the fell race course record?", 220),
]

SYSTEM_RAG = (
    "You are a helpful assistant. Answer the question using only the retrieved "
    "passages. Cite passage numbers in square brackets. If the passages do not "
    "contain the answer, say so."
)


def rag_prompts() -> list[dict[str, object]]:
    rng = random.Random(1142)
    out: list[dict[str, object]] = []
    for i, (question, max_tokens) in enumerate(QUESTIONS):
        # Every prompt sees all passages, in its own order, repeated in part so the prompts
        # span 2-4k tokens like the top-k chunks of a real retriever (chunks overlap).
        order = list(range(len(PASSAGES)))
        rng.shuffle(order)
        extra = order[: 4 + 2 * (i % 4)]
        chunks = [PASSAGES[j] for j in order + extra]
        context = "\n\n".join(f"[{n + 1}] {text}" for n, text in enumerate(chunks))
        user = f"Retrieved passages:\n\n{context}\n\nQuestion: {question}"
        out.append(
            {
                "id": f"rag-{i + 1}",
                "max_tokens": max_tokens,
                "messages": [
                    {"role": "system", "content": SYSTEM_RAG},
                    {"role": "user", "content": user},
                ],
            }
        )
    return out


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    sets = {
        "chat": [
            {"id": f"chat-{i + 1}", "max_tokens": n, "messages": [{"role": "user", "content": q}]}
            for i, (q, n) in enumerate(CHAT)
        ],
        "code": [
            {"id": f"code-{i + 1}", "max_tokens": n, "messages": [{"role": "user", "content": q}]}
            for i, (q, n) in enumerate(CODE)
        ],
        "rag": rag_prompts(),
    }
    for name, items in sets.items():
        path = OUT / f"{name}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for item in items:
                f.write(json.dumps(item, ensure_ascii=False) + "\n")
        print(f"{path}: {len(items)} prompts")


if __name__ == "__main__":
    main()
