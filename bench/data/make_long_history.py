"""Long multi-session histories of one user with one persona, for bench/long_history_eval.py (issue 27).

    .venv/bin/python bench/data/make_long_history.py --lang en --size 5000 --stats     # counts only
    .venv/bin/python bench/data/make_long_history.py --lang zh --size 500 --out /tmp/h  # history.jsonl + questions.jsonl

Nothing is committed but this code: a history is generated at run time, deterministically (``--seed``,
default 27; the same seed, language and size give the same history byte for byte), in English or Chinese, at
any size (the evaluation uses about 500, 5,000 and 50,000 user utterances).

A history is sessions over weeks to years (the span grows with the size: about 60 days at 500, 210 at 5,000,
720 at 50,000), each 4 to 26 user messages, most of them *filler*: chat about work, food, family, the cat,
plans, health, friends, shows and the weather, from templates with many slots (names, restaurants, dishes,
cities, hours, days, numbers), so that the filler talks about the same things the evidence does (other vets'
visits, other restaurants, other colleagues, other trips, other numbers), plus the short messages real chat
is full of ("haha", "ok", "good night"), which repeat. Into it are planted the *evidence items* (``ITEMS``),
24 per language, each asked by one question:

* ``detail``: an exact detail said once (a name, a number, a password, a place, a book's title);
* ``event``: something that happened or will (an interview, a trip, an accident, a wedding, a diagnosis);
* ``preference``: a taste that changed (liked X early on, later dislikes X): the question asks about now, and
  the evidence is the later statement (the earlier one is recorded as ``stale``).

16 items are *old* (their evidence is placed at 5 % to 75 % of the history: weeks to months back, and at
5,000 and 50,000 utterances beyond a window of the newest 1,000) and 8 are *recent* (in the last six
sessions). The same items and questions are used at every size: a bigger history only has more filler
between them (the fractions are the same). Each question records its evidence: the session(s) and message(s)
whose utterance counts as a hit, and ``key``, the text that a profile memory or an episode of an evidence
session must contain to count (so a real model's memories are scored by the same rule as the scripted ones).

Each session also carries what a scripted extraction model answers for it (``memories``: 0-2 profile
memories, the evidence's own when it has one; ``episode``: one short account of the session in the persona's
voice, naming the evidence's detail when the session has evidence). The harness turns these into the model's
JSON answer in one function (``long_history_eval.scripted_answer``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import sys
from pathlib import Path

SIZES = (500, 5000, 50000)
RECENT_SESSIONS = 6  # recent evidence goes into the last this-many sessions
OLD_SPAN = (0.05, 0.75)  # old evidence: at these fractions of the history
END = dt.datetime(2026, 6, 28, 21, 0, tzinfo=dt.UTC)  # the last session starts before this
USER_NAME = {"en": "Sam", "zh": "小林"}

# --- the evidence ------------------------------------------------------------------------------------
# id, kind, age, the utterance(s) planted (the one holding ``key`` is the evidence), key, the profile memory the
# scripted model writes (None: a detail an extraction would not keep), what the episode says, the question;
# preferences also: the earlier stance ("before") and its memory.

ITEMS: dict[str, list[dict]] = {
    "en": [
        dict(id="vet", kind="detail", age="old", key="Okonkwo",
             say="Took Biscuit to a new vet today, Dr. Okonkwo on Fern Street. She was so gentle with him.",
             memory="Biscuit's vet is Dr. Okonkwo on Fern Street", category="relation",
             episode="Sam took Biscuit to a new vet, Dr. Okonkwo on Fern Street, and was relieved how gentle she was.",
             q="What was the name of the vet I told you about?"),
        dict(id="locker", kind="detail", age="old", key="317",
             say="My new gym locker is number 317, writing it here so I don't forget it.", memory=None,
             episode="Sam asked me to remember the new gym locker: number 317.",
             q="What's my gym locker number again?"),
        dict(id="dumplings", kind="detail", age="old", key="Little Sichuan",
             say="We finally tried Little Sichuan House on Barker Road, best dumplings I've had in years.",
             memory="Loves the dumplings at Little Sichuan House on Barker Road", category="preference",
             episode="Sam raved about the dumplings at Little Sichuan House on Barker Road.",
             q="What was that restaurant with the amazing dumplings I mentioned?"),
        dict(id="teammate", kind="detail", age="old", key="Thaddeus",
             say="The new guy on my team is called Thaddeus, he transferred from the Berlin office.",
             memory="Has a new teammate, Thaddeus, who came from the Berlin office", category="relation",
             episode="Sam introduced a new teammate, Thaddeus, transferred from the Berlin office.",
             q="What's the name of the new guy on my team, the one from Berlin?"),
        dict(id="baby", kind="detail", age="old", key="Juniper",
             say="Priya had her baby! A little girl, they named her Juniper.",
             memory="Friend Priya had a baby girl named Juniper", category="relation",
             episode="Sam shared the news that Priya had a baby girl called Juniper.",
             q="What did Priya name her baby?"),
        dict(id="landlord", kind="detail", age="old", key="Haverford",
             say="Our landlord Mr. Haverford finally fixed the boiler after three weeks.", memory=None,
             episode="Sam was glad the landlord, Mr. Haverford, had finally fixed the boiler.",
             q="What's my landlord's name again?"),
        dict(id="book", kind="detail", age="old", key="Salt Orchard",
             say="My sister recommended a novel called The Salt Orchard, I want to read it on holiday.", memory=None,
             episode="Sam's sister recommended a novel, The Salt Orchard, for the holiday.",
             q="What was the book my sister recommended?"),
        dict(id="wifi", kind="detail", age="old", key="bluefinch42",
             say="The wifi password at my mom's place is bluefinch42, in case I ask you later.", memory=None,
             episode="Sam told me the wifi password at mom's place, bluefinch42, to keep for later.",
             q="What's the wifi password at my mom's?"),
        dict(id="interview", kind="event", age="old", key="Northwind",
             say="The interview at Northwind Analytics is on Thursday at 10, I'm so nervous.",
             memory="Had a job interview at Northwind Analytics", category="event",
             episode="Sam was nervous about the job interview at Northwind Analytics on Thursday.",
             q="Remember that job interview I was nervous about? Which company was it?"),
        dict(id="trip", kind="event", age="old", key="Lisbon",
             say="Just got back from Lisbon, the yellow trams and the custard tarts were unreal.",
             memory="Took a trip to Lisbon", category="event",
             episode="Sam came back from a trip to Lisbon, full of the trams and the custard tarts.",
             q="Where did I go on that trip with the trams and the custard tarts?"),
        dict(id="accident", kind="event", age="old", key="Elm Road",
             say="Someone rear-ended my car at the roundabout on Elm Road. I'm okay, just shaken.",
             memory="Was rear-ended in a car accident on Elm Road, unhurt", category="event",
             episode="Sam was shaken after being rear-ended at the roundabout on Elm Road.",
             q="Remember when my car got hit? Where did that happen?"),
        dict(id="wedding", kind="event", age="old", key="Sonoma",
             say="My sister's wedding is booked at a vineyard in Sonoma on September 14.",
             memory="Sister's wedding is at a vineyard in Sonoma on 14 September", category="event",
             episode="Sam told me the sister's wedding will be at a vineyard in Sonoma on 14 September.",
             q="Where is my sister's wedding going to be?"),
        dict(id="mole", kind="event", age="old", key="dermatologist",
             say="The dermatologist said the mole on my back is harmless, huge relief.",
             memory="A dermatologist found the mole on the back harmless", category="event",
             episode="Sam was relieved: the dermatologist said the mole on the back is harmless.",
             q="What did the dermatologist say about my mole?"),
        dict(id="coffee", kind="preference", age="old", key="green tea",
             before="I can't start the day without a double espresso.",
             before_memory="Loves a double espresso every morning",
             say="I've quit coffee completely and switched to green tea, I feel so much better.",
             memory="Quit coffee; drinks green tea instead", category="preference",
             episode="Sam has quit coffee for green tea and feels much better for it.",
             q="Am I still drinking coffee these days?"),
        dict(id="running", kind="preference", age="old", key="swimming",
             before="I love my morning runs along the river, best part of the day.",
             before_memory="Loves morning runs along the river",
             say="I've really come to hate running, my knees can't take it, so I'm swimming instead.",
             memory="Now dislikes running (bad knees); swimming instead", category="preference",
             episode="Sam gave up running because of the knees and has taken up swimming.",
             q="Do I still enjoy running?"),
        dict(id="cilantro", kind="preference", age="old", key="soap",
             before="Cilantro is my favourite herb, I put it on everything.",
             before_memory="Loves cilantro, puts it on everything",
             say="Weird thing: cilantro tastes like soap to me now, I can't stand it anymore.",
             memory="Can no longer stand cilantro; it tastes like soap", category="preference",
             episode="Sam said cilantro now tastes like soap and can't stand it anymore.",
             q="How do I feel about cilantro these days?"),
        dict(id="plumber", kind="detail", age="recent", key="Ignatius",
             say="The plumber who came today was called Ignatius, he left his card on the fridge.", memory=None,
             episode="Sam had a plumber over, Ignatius, who left his card on the fridge.",
             q="What was the plumber's name?"),
        dict(id="reunion", kind="detail", age="recent", key="Marlowe",
             say="Booked the reunion dinner at Marlowe's for Saturday, a table for seven.", memory=None,
             episode="Sam booked the reunion dinner at Marlowe's for Saturday, seven people.",
             q="Where did I book the reunion dinner?"),
        dict(id="offer", kind="event", age="recent", key="Brightline",
             say="I got the offer from Brightline! I start in three weeks.",
             memory="Got a job offer from Brightline", category="event",
             episode="Sam got a job offer from Brightline and starts in three weeks.",
             q="Which company did I get the offer from?"),
        dict(id="grandma", kind="event", age="recent", key="St. Anne",
             say="Grandma fell and she's at St. Anne's hospital, I'm visiting her tomorrow.",
             memory="Grandma fell and is in St. Anne's hospital", category="event",
             episode="Sam was worried: grandma fell and is in St. Anne's hospital.",
             q="Which hospital is my grandma in?"),
        dict(id="music", kind="preference", age="recent", key="lo-fi",
             before="Jazz is the only thing I can listen to while I work.",
             before_memory="Listens only to jazz while working",
             say="Lately I can't stand jazz, I've switched to lo-fi beats when I work.",
             memory="Now dislikes jazz; listens to lo-fi beats while working", category="preference",
             episode="Sam has gone off jazz and works to lo-fi beats now.",
             q="What music am I into lately when I work?"),
        dict(id="corgi", kind="detail", age="recent", key="Waffles",
             say="My cousin got a corgi puppy and named it Waffles.", memory=None,
             episode="Sam told me the cousin's new corgi puppy is called Waffles.",
             q="What's my cousin's puppy called?"),
        dict(id="cafe", kind="detail", age="recent", key="Ink Pot",
             say="Found a quiet café called The Ink Pot next to the library, perfect for working.",
             memory="Likes working at The Ink Pot café next to the library", category="preference",
             episode="Sam found a quiet café to work in, The Ink Pot, next to the library.",
             q="What was that café by the library I found?"),
        dict(id="ankle", kind="event", age="recent", key="badminton",
             say="Sprained my ankle playing badminton last night, it's all swollen.",
             memory="Sprained an ankle playing badminton", category="event",
             episode="Sam sprained an ankle playing badminton and it is swollen.",
             q="How did I hurt my ankle?"),
    ],
    "zh": [
        dict(id="vet", kind="detail", age="old", key="欧阳",
             say="今天带团子去看了新的兽医，欧阳医生，在梧桐路上，对它特别温柔。",
             memory="团子的兽医是梧桐路的欧阳医生", category="relation",
             episode="小林带团子去看了新的兽医欧阳医生，在梧桐路，很温柔。",
             q="你还记得我说的那个兽医叫什么吗？"),
        dict(id="locker", kind="detail", age="old", key="317",
             say="健身房新的储物柜是317号，记一下免得我忘了。", memory=None,
             episode="小林让我记住健身房新的储物柜：317号。",
             q="我健身房的储物柜是几号来着？"),
        dict(id="pork", kind="detail", age="old", key="老灶台",
             say="终于去了巷子里那家叫老灶台的馆子，红烧肉绝了。",
             memory="很喜欢老灶台的红烧肉", category="preference",
             episode="小林去了老灶台，对那里的红烧肉赞不绝口。",
             q="你还记得我上次说的那个红烧肉特别好吃的餐厅吗？"),
        dict(id="teammate", kind="detail", age="old", key="司马骁",
             say="组里新来的同事叫司马骁，是从深圳分公司调过来的。",
             memory="组里新同事司马骁，从深圳分公司调来", category="relation",
             episode="小林说组里来了新同事司马骁，从深圳分公司调过来。",
             q="从深圳调来的那个新同事叫什么？"),
        dict(id="baby", kind="detail", age="old", key="糯米",
             say="小雅生了！是个女儿，小名叫糯米。",
             memory="朋友小雅生了女儿，小名糯米", category="relation",
             episode="小林告诉我小雅生了个女儿，小名叫糯米。",
             q="小雅的女儿小名叫什么？"),
        dict(id="landlord", kind="detail", age="old", key="宫阿姨",
             say="房东宫阿姨终于把热水器修好了，拖了三个礼拜。", memory=None,
             episode="小林说房东宫阿姨终于把热水器修好了。",
             q="我房东姓什么来着？"),
        dict(id="book", kind="detail", age="old", key="盐田往事",
             say="我姐推荐了一本小说叫《盐田往事》，想放假的时候看。", memory=None,
             episode="小林的姐姐推荐了小说《盐田往事》，打算放假看。",
             q="我姐推荐的那本书叫什么？"),
        dict(id="wifi", kind="detail", age="old", key="huamei2024",
             say="我妈家的wifi密码是huamei2024，以后我问你你告诉我。", memory=None,
             episode="小林让我记住妈妈家的wifi密码：huamei2024。",
             q="我妈家的wifi密码是啥？"),
        dict(id="interview", kind="event", age="old", key="北辰",
             say="周四上午十点要去北辰科技面试，紧张死了。",
             memory="去北辰科技面试过", category="event",
             episode="小林很紧张，周四上午要去北辰科技面试。",
             q="我之前特别紧张的那个面试是哪家公司？"),
        dict(id="trip", kind="event", age="old", key="厦门",
             say="刚从厦门回来，鼓浪屿和沙茶面都太棒了。",
             memory="去厦门旅行过", category="event",
             episode="小林刚从厦门旅行回来，念念不忘鼓浪屿和沙茶面。",
             q="我上次旅行吃沙茶面是去的哪里？"),
        dict(id="accident", kind="event", age="old", key="滨江路",
             say="在滨江路那个环岛被人追尾了，人没事，就是吓到了。",
             memory="在滨江路环岛被追尾，人没事", category="event",
             episode="小林在滨江路环岛被追尾，人没事但受了惊吓。",
             q="我的车被追尾是在哪儿？"),
        dict(id="wedding", kind="event", age="old", key="莫干山",
             say="我姐的婚礼定在莫干山的一个民宿，九月十四号。",
             memory="姐姐九月十四号在莫干山的民宿办婚礼", category="event",
             episode="小林说姐姐的婚礼定在莫干山的民宿，九月十四号。",
             q="我姐的婚礼在哪里办？"),
        dict(id="mole", kind="event", age="old", key="痣",
             say="皮肤科医生说我背上那颗痣没事，松了一口气。",
             memory="皮肤科医生说背上的痣没问题", category="event",
             episode="小林松了口气：皮肤科医生说背上那颗痣没事。",
             q="皮肤科医生怎么说我那颗痣的？"),
        dict(id="coffee", kind="preference", age="old", key="绿茶",
             before="每天早上不来杯美式根本醒不过来。", before_memory="每天早上离不开美式咖啡",
             say="我已经彻底戒咖啡了，改喝绿茶，感觉好多了。",
             memory="戒了咖啡，改喝绿茶", category="preference",
             episode="小林戒了咖啡改喝绿茶，说感觉好多了。",
             q="我现在还喝咖啡吗？"),
        dict(id="running", kind="preference", age="old", key="游泳",
             before="我最爱早上沿着江边跑步，一天里最舒服的时候。", before_memory="喜欢早上沿江边跑步",
             say="现在越来越讨厌跑步了，膝盖受不了，改去游泳了。",
             memory="现在讨厌跑步（膝盖不好），改游泳", category="preference",
             episode="小林因为膝盖不再跑步，改去游泳了。",
             q="我现在还喜欢跑步吗？"),
        dict(id="cilantro", kind="preference", age="old", key="肥皂",
             before="香菜是我的最爱，什么菜都要放。", before_memory="最爱香菜，什么菜都放",
             say="奇怪，现在觉得香菜有股肥皂味，完全受不了了。",
             memory="现在受不了香菜，觉得有肥皂味", category="preference",
             episode="小林说现在觉得香菜有肥皂味，完全受不了。",
             q="我现在对香菜什么态度？"),
        dict(id="plumber", kind="detail", age="recent", key="钟师傅",
             say="今天来修水管的是钟师傅，把名片贴在冰箱上了。", memory=None,
             episode="小林家来修水管的是钟师傅，名片贴在冰箱上。",
             q="来修水管的师傅姓什么？"),
        dict(id="reunion", kind="detail", age="recent", key="渔舟唱晚",
             say="同学聚会订在了渔舟唱晚，周六，七个人。", memory=None,
             episode="小林把同学聚会订在了渔舟唱晚，周六七个人。",
             q="同学聚会订在哪家店了？"),
        dict(id="offer", kind="event", age="recent", key="星河互娱",
             say="我拿到星河互娱的offer了！三周后入职。",
             memory="拿到了星河互娱的offer", category="event",
             episode="小林拿到了星河互娱的offer，三周后入职。",
             q="我拿到的是哪家公司的offer？"),
        dict(id="grandma", kind="event", age="recent", key="仁济",
             say="奶奶摔了一跤，住进了仁济医院，我明天去看她。",
             memory="奶奶摔倒住进仁济医院", category="event",
             episode="小林很担心：奶奶摔倒住进了仁济医院。",
             q="奶奶住在哪家医院？"),
        dict(id="music", kind="preference", age="recent", key="白噪音",
             before="工作的时候我只听爵士乐。", before_memory="工作时只听爵士乐",
             say="最近听不下去爵士了，工作时改听白噪音。",
             memory="最近不爱听爵士，工作时听白噪音", category="preference",
             episode="小林最近听不下去爵士，工作时改听白噪音。",
             q="我最近工作的时候听什么？"),
        dict(id="corgi", kind="detail", age="recent", key="华夫",
             say="表哥新养了一只柯基，叫华夫。", memory=None,
             episode="小林说表哥新养的柯基叫华夫。",
             q="我表哥的柯基叫什么？"),
        dict(id="cafe", kind="detail", age="recent", key="墨水瓶",
             say="在图书馆旁边发现一家安静的咖啡馆叫墨水瓶，很适合办公。",
             memory="喜欢在图书馆旁的墨水瓶咖啡馆办公", category="preference",
             episode="小林在图书馆旁发现了安静的咖啡馆墨水瓶，适合办公。",
             q="我在图书馆旁边发现的那家咖啡馆叫什么？"),
        dict(id="ankle", kind="event", age="recent", key="羽毛球",
             say="昨晚打羽毛球把脚踝扭了，肿得厉害。",
             memory="打羽毛球扭伤了脚踝", category="event",
             episode="小林打羽毛球扭伤了脚踝，肿得厉害。",
             q="我的脚踝是怎么扭到的？"),
    ],
}

# --- the filler ----------------------------------------------------------------------------------------
# Per language: slot values, and per topic its templates, the profile memories a session on it may leave, and
# how its episode is told. The topics are the evidence's topics (work, food, family, the cat, trips, health...),
# with look-alikes: other vets' visits, restaurants, colleagues, trips and numbers.

SLOTS = {
    "en": {
        "friend": ["Maya", "Jonah", "Leila", "Tom", "Grace", "Devin", "Nora", "Oscar", "Ruth", "Felix", "Ivy",
                   "Marcus", "Hana", "Luis", "Chloe", "Ben"],
        "colleague": ["Karen", "Raj", "Beatrice", "Miguel", "Dana", "Stefan", "Olu", "Hiro", "Paula", "Gwen"],
        "restaurant": ["Golden Bowl", "Nonna's Kitchen", "Saigon Corner", "The Green Fork", "Taco Loco",
                       "Blue Lantern", "Masala House", "Harbour Grill", "Sakura Bento", "Olive & Thyme"],
        "dish": ["pad thai", "lasagna", "ramen", "a veggie curry", "fish tacos", "mapo tofu", "a mushroom risotto",
                 "shakshuka", "bibimbap", "chicken soup", "pancakes", "a Greek salad", "pho", "burritos"],
        "city": ["Porto", "Kyoto", "Edinburgh", "Vienna", "Seattle", "Prague", "Montreal", "Oaxaca", "Bergen",
                 "Seville", "Hanoi", "Copenhagen"],
        "relative": ["mom", "dad", "my brother", "my sister", "grandpa", "my aunt", "my cousin", "my uncle"],
        "day": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"],
        "hour": ["8", "9", "10", "11", "half past nine", "midnight"],
        "project": ["the quarterly report", "the client deck", "the migration", "the budget review",
                    "the onboarding guide", "the product launch", "the audit", "the hiring plan"],
        "show": ["a crime documentary", "that baking show", "a Korean drama", "an old sitcom", "a space series",
                 "a cooking competition", "a nature documentary"],
        "activity": ["a hike", "a pottery class", "the farmers market", "a movie night", "a board game night",
                     "yoga", "a bike ride", "the museum", "a picnic"],
        "n": [str(x) for x in (2, 3, 4, 5, 6, 7, 12, 15, 20, 25, 40, 45, 90)],
    },
    "zh": {
        "friend": ["阿珍", "大伟", "小雨", "老周", "思思", "浩子", "婷婷", "阿杰", "佳佳", "小胖", "文文", "阿豪",
                   "晓晓", "老陈"],
        "colleague": ["王姐", "小赵", "李工", "陈经理", "阿斌", "刘总", "小孙", "周老师", "丽丽", "老马"],
        "restaurant": ["外婆家", "小南国", "云海肴", "新白鹿", "海底捞", "西贝", "太二酸菜鱼", "望湘园",
                       "鼎泰丰", "南京大牌档"],
        "dish": ["番茄炒蛋", "可乐鸡翅", "红烧排骨", "酸菜鱼", "麻婆豆腐", "西红柿牛腩", "葱油拌面", "饺子",
                 "小龙虾", "宫保鸡丁", "酸辣土豆丝", "馄饨", "火锅", "煲仔饭"],
        "city": ["成都", "西安", "大理", "青岛", "杭州", "桂林", "哈尔滨", "长沙", "重庆", "苏州", "丽江",
                 "三亚"],
        "relative": ["我妈", "我爸", "我哥", "我姐", "外公", "姑姑", "表妹", "舅舅"],
        "day": ["周一", "周二", "周三", "周四", "周五", "周六", "周日"],
        "hour": ["八点", "九点", "十点", "十一点", "九点半", "半夜十二点"],
        "project": ["季度报告", "客户方案", "系统迁移", "预算评审", "新人手册", "产品发布", "审计材料",
                    "招聘计划"],
        "show": ["一部悬疑剧", "那个烘焙节目", "一部韩剧", "一部老情景喜剧", "一部科幻剧", "一个美食综艺",
                 "一部纪录片"],
        "activity": ["爬山", "陶艺课", "逛菜市场", "看电影", "桌游", "瑜伽", "骑车", "逛博物馆", "野餐"],
        "n": [str(x) for x in (2, 3, 4, 5, 6, 7, 12, 15, 20, 25, 40, 45, 90)],
    },
}

TOPICS: dict[str, dict[str, dict]] = {
    "en": {
        "work": dict(
            say=["{colleague} wants {project} by {day}, again last minute.", "Stayed at the office till {hour} again.",
                 "The meeting about {project} ran over by an hour.", "{colleague} took credit for my slides today.",
                 "My boss added {n} more tickets to the sprint.", "I finally finished {project}, what a relief.",
                 "Thinking of asking {colleague} to help with {project}.", "We have a team lunch on {day}.",
                 "Work is so busy this week, {n} deadlines.", "I might work from home on {day}."],
            memory=["Often works late; the boss keeps adding requests", "Finds team meetings draining"],
            episode="Sam vented to me about work: {first}"),
        "food": dict(
            say=["Made {dish} for dinner, it turned out great.", "We ordered from {restaurant}, a bit too salty.",
                 "Tried {dish} at {restaurant} with {friend}.", "I'm craving {dish} so badly right now.",
                 "Lunch was just {dish} at my desk.", "{restaurant} has a new menu, we should try it.",
                 "Cooking {dish} tonight, wish me luck.", "Had {dish} at {restaurant}, pretty average honestly."],
            memory=["Enjoys cooking dinner at home", "Likes trying new restaurants with friends"],
            episode="Sam and I talked about food: {first}"),
        "family": dict(
            say=["{relative} called about the holidays.", "{relative} keeps asking when I'll visit.",
                 "Had a long video call with {relative} tonight.", "{relative} sent me a photo of the garden.",
                 "{relative} is not feeling great, a cold probably.", "Visiting {relative} on {day}.",
                 "{relative} wants everyone home for a dinner in {n} weeks."],
            memory=["Stays in close touch with the family", "Family often asks about visiting"],
            episode="Sam shared family news: {first}"),
        "pet": dict(
            say=["Biscuit knocked a glass off the table again.", "Biscuit has a vet checkup on {day}.",
                 "Biscuit slept on my keyboard all morning.", "The vet said Biscuit needs to lose a little weight.",
                 "Biscuit threw up a hairball on the rug.", "Bought Biscuit a new scratching post.",
                 "Biscuit is {n} pounds now, chonky boy.", "Biscuit hid under the bed during the storm."],
            memory=["Has a cat named Biscuit"],
            episode="Sam told me about Biscuit the cat: {first}"),
        "plans": dict(
            say=["Thinking about a trip to {city} next year.", "{friend} and I might do {activity} on {day}.",
                 "I want to book {activity} for the weekend.", "Maybe a long weekend in {city}?",
                 "{friend} invited me to {activity}.", "Planning {activity} with {friend} in {n} days.",
                 "Flights to {city} are so expensive right now."],
            memory=["Likes planning weekend activities with friends", "Dreams of travelling more"],
            episode="Sam talked about plans: {first}"),
        "health": dict(
            say=["Slept badly again, maybe {n} hours.", "My back hurts from sitting all day.",
                 "I have a dentist appointment on {day}.", "Trying to drink more water this week.",
                 "Got a bit of a headache since {hour}.", "Went to the gym, {n} minutes on the bike.",
                 "The doctor wants me to get a blood test on {day}."],
            memory=["Struggles with sleep", "Trying to look after health"],
            episode="Sam mentioned health things: {first}"),
        "friends": dict(
            say=["{friend} is going through a breakup, I feel bad for them.", "Caught up with {friend} over drinks.",
                 "{friend} is moving to {city}.", "{friend} hasn't texted back in {n} days.",
                 "{friend}'s birthday party is on {day}.", "{friend} got a new job, so happy for them."],
            memory=["Cares a lot about friends"],
            episode="Sam told me about friends: {first}"),
        "leisure": dict(
            say=["Watching {show} tonight.", "Started {show}, it's so good.", "Finished {show}, the ending was weird.",
                 "It's pouring rain here.", "Such a sunny day, finally.", "Reading before bed, trying to cut screens.",
                 "Spent the evening doing a puzzle."],
            memory=["Unwinds with TV shows in the evening"],
            episode="Sam and I chatted about downtime: {first}"),
    },
    "zh": {
        "work": dict(
            say=["{colleague}又让我{day}之前交{project}，又是临时通知。", "今天又在公司待到{hour}。",
                 "{project}的会又拖了一个小时。", "{colleague}今天把我做的PPT说成是他做的。",
                 "老板又往这个迭代里加了{n}个需求。", "终于把{project}弄完了，松了口气。",
                 "想找{colleague}帮忙弄{project}。", "{day}组里聚餐。", "这周太忙了，{n}个截止日期。",
                 "{day}可能在家办公。"],
            memory=["经常加班，老板总是加需求", "觉得开会很消耗人"],
            episode="小林跟我吐槽工作：{first}"),
        "food": dict(
            say=["晚饭做了{dish}，味道不错。", "点了{restaurant}的外卖，有点咸。", "和{friend}去{restaurant}吃了{dish}。",
                 "现在特别想吃{dish}。", "午饭就在工位上吃了{dish}。", "{restaurant}出新菜单了，下次去试试。",
                 "今晚挑战做{dish}。", "在{restaurant}吃了{dish}，说实话一般般。"],
            memory=["喜欢在家做饭", "喜欢和朋友一起尝试新餐厅"],
            episode="小林和我聊吃的：{first}"),
        "family": dict(
            say=["{relative}打电话问过年的安排。", "{relative}老问我什么时候回家。", "今晚和{relative}视频聊了好久。",
                 "{relative}给我发了院子里的照片。", "{relative}身体不太舒服，可能感冒了。", "{day}去看{relative}。",
                 "{relative}说{n}个礼拜后全家一起吃饭。"],
            memory=["和家里联系很紧密", "家里人常问什么时候回家"],
            episode="小林说了家里的事：{first}"),
        "pet": dict(
            say=["团子又把杯子推到地上了。", "团子{day}要去做体检。", "团子一上午都睡在我键盘上。",
                 "兽医说团子要稍微减减肥。", "团子在地毯上吐了毛球。", "给团子买了个新猫抓板。",
                 "团子现在{n}斤了，胖墩一个。", "打雷的时候团子躲到床底下了。"],
            memory=["养了一只猫叫团子"],
            episode="小林说起猫咪团子：{first}"),
        "plans": dict(
            say=["想明年去{city}玩。", "{friend}和我{day}可能去{activity}。", "周末想约个{activity}。",
                 "要不要趁小长假去{city}？", "{friend}约我去{activity}。", "{n}天后和{friend}去{activity}。",
                 "去{city}的机票现在好贵。"],
            memory=["喜欢和朋友安排周末活动", "很想多出去旅行"],
            episode="小林聊了计划：{first}"),
        "health": dict(
            say=["昨晚又没睡好，大概睡了{n}个小时。", "坐了一天腰好疼。", "{day}要去看牙。", "这周努力多喝水。",
                 "从{hour}开始就有点头疼。", "去健身房骑了{n}分钟单车。", "医生让我{day}去抽个血。"],
            memory=["睡眠不太好", "在努力注意身体"],
            episode="小林说了身体的情况：{first}"),
        "friends": dict(
            say=["{friend}失恋了，挺心疼的。", "和{friend}喝了一杯聊了聊近况。", "{friend}要搬去{city}了。",
                 "{friend}{n}天没回我消息了。", "{friend}的生日聚会在{day}。", "{friend}找到新工作了，替他高兴。"],
            memory=["很在乎朋友"],
            episode="小林聊了朋友们：{first}"),
        "leisure": dict(
            say=["今晚看{show}。", "开始追{show}，太好看了。", "{show}看完了，结局好奇怪。", "这边下大雨了。",
                 "终于出太阳了。", "睡前看会书，想少刷手机。", "晚上拼了一晚上拼图。"],
            memory=["晚上喜欢追剧放松"],
            episode="小林和我闲聊休闲时光：{first}"),
    },
}

SMALL = {
    "en": ["hey", "hi Luna", "morning!", "I'm back", "haha", "lol true", "yeah", "ok", "hmm", "thanks",
           "good night", "what do you think?", "right?", "anyway", "ugh", "sounds good", "I know right",
           "not sure", "tell me something nice", "long day"],
    "zh": ["在吗", "嗨", "早呀", "我回来啦", "哈哈", "笑死", "嗯嗯", "好的", "唉", "谢谢", "晚安", "你觉得呢？",
           "是吧", "算了", "无语", "好呀", "就是说", "不知道", "说点开心的吧", "好累"],
}


# What people wrap their sentences in (topical filler only): more ways to say the same thing, as in real chat.
AROUND = {
    "en": (["", "", "", "", "Ugh, ", "So, ", "Btw ", "Okay so ", "Honestly ", "Guess what, ", "Update: ", "Hmm, "],
           ["", "", "", "", " lol", " haha", ", so annoying", ", not gonna lie", " again", " 😅", " to be honest",
            ", whatever", "!!", ", you know?"]),
    "zh": (["", "", "", "", "唉，", "跟你说，", "对了，", "话说", "哎，", "我跟你讲，", "嗯，"],
           ["", "", "", "", "哈哈", "，烦死了", "，真的", "～", "😅", "，说实话", "啊", "，你懂吧", "！！"]),
}


# --- the generator ------------------------------------------------------------------------------------

def span_days(size: int) -> int:
    """How many days a history of ``size`` utterances spans: about 60 at 500, 210 at 5,000, 720 at 50,000."""
    return max(20, round(60 * (size / 500) ** 0.54))


def _fill(template: str, slots: dict[str, list[str]], rng: random.Random) -> str:
    out = template
    for name, values in slots.items():
        token = "{" + name + "}"
        while token in out:
            out = out.replace(token, rng.choice(values), 1)
    return out


def _wrap(lang: str, text: str, rng: random.Random) -> str:
    before, after = AROUND[lang]
    head, tail = rng.choice(before), rng.choice(after)
    if head and lang == "en" and not text.startswith(("I ", "I'm", "Biscuit")) and text[:1].isupper() \
            and text.split()[0] not in {n for v in SLOTS["en"].values() for n in v}:
        text = text[:1].lower() + text[1:]
    if tail and text[-1:] in ".!?。！？":
        text = text[:-1]
    return head + text + tail


def _filler_session(lang: str, length: int, rng: random.Random) -> dict:
    topics = TOPICS[lang]
    chosen = rng.sample(sorted(topics), rng.choice((1, 1, 2)))
    turns: list[str] = []
    content: list[str] = []
    small = SMALL[lang]
    for _ in range(length):
        if rng.random() < 0.3:
            turns.append(rng.choice(small))
        else:
            text = _wrap(lang, _fill(rng.choice(topics[rng.choice(chosen)]["say"]), SLOTS[lang], rng), rng)
            turns.append(text)
            content.append(text)
    if not content:  # every session says something of substance
        text = _fill(rng.choice(topics[chosen[0]]["say"]), SLOTS[lang], rng)
        turns[-1] = text
        content.append(text)
    memories = []
    if rng.random() < 0.4:
        topic = topics[chosen[0]]
        memories.append({"content": rng.choice(topic["memory"]), "category": "fact" if chosen[0] != "food"
                         else "preference", "importance": 0.3})
    episode = topics[chosen[0]]["episode"].format(first=content[0])
    return {"topics": chosen, "turns": turns, "memories": memories, "episode": episode, "evidence": []}


def _plant(session: dict, text: str, rng: random.Random) -> int:
    """Put ``text`` into the session at a random place (after its first message); its index."""
    at = rng.randint(1, len(session["turns"]))
    session["turns"].insert(at, text)
    return at


def _positions(sessions: int, items: list[dict]) -> dict[str, tuple[int | None, int]]:
    """Per item: the session of its earlier stance (preferences) and of its evidence. Old items are spread
    over OLD_SPAN of the history (in list order), recent ones over the last RECENT_SESSIONS sessions."""
    old = [i for i in items if i["age"] == "old"]
    recent = [i for i in items if i["age"] == "recent"]
    out: dict[str, tuple[int | None, int]] = {}
    lo, hi = OLD_SPAN
    last = sessions - 1
    for n, item in enumerate(old):
        at = round((lo + (hi - lo) * (n + 0.5) / len(old)) * last)
        before = round(0.6 * at) if item["kind"] == "preference" else None
        out[item["id"]] = (before, at)
    for n, item in enumerate(recent):
        at = last - RECENT_SESSIONS + 1 + n % RECENT_SESSIONS
        before = round(0.3 * last) if item["kind"] == "preference" else None
        out[item["id"]] = (before, max(at, 0))
    return out


def generate(lang: str, size: int, seed: int = 27) -> dict:
    """One history: ``sessions`` (at, turns, topics, memories, episode, evidence ids) and ``questions``."""
    if lang not in ITEMS:
        raise ValueError(f"lang must be one of {sorted(ITEMS)}")
    rng = random.Random(f"{seed}:{lang}:{size}")
    items = ITEMS[lang]
    planted = sum(2 if i["kind"] == "preference" else 1 for i in items)
    lengths: list[int] = []
    while sum(lengths) + planted < size:
        lengths.append(rng.randint(4, 26))
    if len(lengths) < RECENT_SESSIONS + 2:
        raise ValueError(f"size {size} is too small for a history (at least ~{(RECENT_SESSIONS + 2) * 15})")
    overshoot = sum(lengths) + planted - size  # trim the last sessions so the total is exactly ``size``
    for i in range(len(lengths) - 1, -1, -1):
        cut = min(overshoot, lengths[i] - 4)
        lengths[i] -= cut
        overshoot -= cut
    sessions = [_filler_session(lang, n, rng) for n in lengths]
    days = span_days(size)
    start = END - dt.timedelta(days=days)
    step = (END - start) / len(sessions)
    for i, s in enumerate(sessions):
        at = start + step * i + dt.timedelta(minutes=rng.randint(0, max(1, int(step.total_seconds() / 120))))
        s["at"] = at.replace(second=0, microsecond=0).isoformat()
    ask = (END + dt.timedelta(days=1)).replace(hour=20, minute=0).isoformat()
    questions = []
    positions = _positions(len(sessions), items)
    for item in items:
        before_at, at = positions[item["id"]]
        stale = None
        if before_at is not None:
            s = sessions[before_at]
            stale = {"session": before_at, "turn": _plant(s, item["before"], rng)}
            s["memories"].insert(0, {"content": item["before_memory"], "category": "preference", "importance": 0.5})
        s = sessions[at]
        turn = _plant(s, item["say"], rng)
        if item.get("memory"):
            s["memories"].insert(0, {"content": item["memory"], "category": item["category"], "importance": 0.6})
        s["evidence"].append(item["id"])
        told = [i["episode"] for i in items if i["id"] in s["evidence"]]
        filler = s.setdefault("filler_episode", s["episode"])
        s["episode"] = " ".join(told + ([filler] if sum(map(len, told)) + len(filler) < 280 else []))
        questions.append({"id": f"{lang}-{item['id']}", "lang": lang, "kind": item["kind"], "age": item["age"],
                          "text": item["q"], "at": ask, "key": item["key"],
                          "evidence": {"session": at, "turn": turn, "text": item["say"]},
                          "stale": stale and dict(stale, text=item["before"]),
                          "memory": item.get("memory")})
    _settle(sessions, questions)
    return {"lang": lang, "size": size, "seed": seed, "user": USER_NAME[lang], "span_days": days,
            "sessions": sessions, "questions": questions}


def _settle(sessions: list[dict], questions: list[dict]) -> None:
    """Turn indices move when two plants share a session: find each planted text again, and count how many
    utterances are newer than each question's evidence (``utterances_back``)."""
    after = [0] * len(sessions)
    total = 0
    for i in range(len(sessions) - 1, -1, -1):
        after[i] = total
        total += len(sessions[i]["turns"])
    for q in questions:
        for ref in (q["evidence"], q["stale"]):
            if ref is None:
                continue
            turns = sessions[ref["session"]]["turns"]
            ref["turn"] = turns.index(ref["text"])
        ev = q["evidence"]
        q["utterances_back"] = after[ev["session"]] + len(sessions[ev["session"]]["turns"]) - ev["turn"] - 1
        q["days_back"] = round((dt.datetime.fromisoformat(q["at"])
                                - dt.datetime.fromisoformat(sessions[ev["session"]]["at"])).total_seconds() / 86400, 1)


def stats(history: dict) -> dict:
    sessions, questions = history["sessions"], history["questions"]
    texts = [t for s in sessions for t in s["turns"]]
    return {"lang": history["lang"], "size": history["size"], "sessions": len(sessions), "utterances": len(texts),
            "unique_utterances": len(set(texts)), "span_days": history["span_days"],
            "memories": sum(len(s["memories"]) for s in sessions), "questions": len(questions),
            "old": sum(q["age"] == "old" for q in questions), "recent": sum(q["age"] == "recent" for q in questions),
            "old_beyond_1000": sum(q["age"] == "old" and q["utterances_back"] > 1000 for q in questions),
            "old_utterances_back": [min((q["utterances_back"] for q in questions if q["age"] == "old"), default=0),
                                    max((q["utterances_back"] for q in questions if q["age"] == "old"), default=0)],
            "old_days_back": [min((q["days_back"] for q in questions if q["age"] == "old"), default=0),
                              max((q["days_back"] for q in questions if q["age"] == "old"), default=0)]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--lang", choices=sorted(ITEMS), default="en")
    ap.add_argument("--size", type=int, default=500)
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--out", default="", help="a folder for history.jsonl (one session a line) and questions.jsonl")
    ap.add_argument("--stats", action="store_true", help="print the counts only")
    args = ap.parse_args(argv)
    history = generate(args.lang, args.size, args.seed)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for name in ("sessions", "questions"):
            with open(out / f"{'history' if name == 'sessions' else name}.jsonl", "w", encoding="utf-8") as f:
                for row in history[name]:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
    json.dump(stats(history), sys.stdout, ensure_ascii=False)
    print()


if __name__ == "__main__":
    main()
