"""Writes the recall dev set (bench/data/recall_dev/{memories,queries}.jsonl) without embeddings.

The set is written by us, from the templates below, deterministically (seeded): 24 users (12
English, 12 Chinese), each with a profile as dreaming would extract it, a few raw relationship
utterances, and queries in the user's own voice (what the chat turn embeds). What it covers:

* knowledge updates -- moved city, changed job, new partner, changed taste: the old fact is kept
  (nothing is deleted) and listed in the query's ``superseded_ids``; the new one is relevant;
  update ages vary from days to most of a year, so decay cannot always tell them apart;
* the same update asked *before* it happened (``at`` earlier): then the old fact is the answer;
* stable facts said long ago (a child, a pet, an allergy: 200-900 days) that must still surface,
  with fresh trivia and look-alike distractors around them;
* important versus trivial facts on one topic ("her mother keeps pushing her to marry" vs "her
  mother likes gardening"): the important one is the relevant one;
* a recent event versus an old one of the same kind;
* relationship-layer utterances (a promise, a plan) and cross-layer repeats of profile facts;
* distractors: recent trivia, other people's cities and jobs, paraphrased duplicates, and every
  other user's rows (recall is per user, so those must never appear).

What consolidation must get right and must not break (issue 7), drawn from a second random
stream per user so that every row and query above stays exactly as it was:

* update chains A -> B -> C (a habit that changed twice: exercise, diet, commute); asked after C,
  C must beat both A and B; asked between B and C, B is the answer;
* the same fact repeated in three sessions (paraphrases weeks apart: training for a marathon,
  learning Japanese, saving for a flat): one fact, three rows, until consolidation merges them;
* over-invalidation traps: a newer memory that is related but contradicts nothing ("adopted a
  second cat" after "has a cat named Mochi", "also allergic to cats" after "allergic to peanuts",
  "Lily lost her first tooth" after "has a daughter named Lily"); the old fact stays true, and
  queries about it (tag ``trap``) must still find it.

Memories carry truth labels saying what a correct consolidation would do when the row is written:
``supersedes`` (ids of older rows this one replaces: a changed fact), ``same_as`` (the id of a
known row this one restates: no new row, the known one is confirmed), ``fact`` (one key shared
by every row that states the same fact, for counting active duplicates) and, on the traps,
``related_to`` (the older row it is about but does not contradict: both stay active).
bench/recall_eval.py ``--consolidation oracle`` applies them.

Each query also carries ``tags`` (``update``, ``stable``, ``importance``, ``event``,
``relationship``, ``as_of``, ``chain``, ``repeat``, ``trap``, ``en``/``zh``) for the per-slice
tables of bench/recall_eval.py.

    .venv/bin/python bench/data/make_recall_dev.py      # then bench/embed_recall_dev.py adds embeddings
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

OUT = Path(__file__).resolve().parent / "recall_dev"
ANCHOR = datetime(2026, 5, 1, 20, 0, tzinfo=timezone.utc)

# --- English ----------------------------------------------------------------------------------------
EN = {
    "names": ["Maya", "Tom", "Lena", "Raj", "Sofia", "Ben", "Aiko", "Carlos", "Emma", "Kwame", "Julia", "Noah"],
    "cities": ["Shanghai", "Tokyo", "Berlin", "Lisbon", "Toronto", "Seattle", "Melbourne", "Austin", "Dublin",
               "Seoul", "Singapore", "Chicago", "Denver", "Boston", "Madrid", "Vancouver"],
    "jobs": ["a nurse at a children's hospital", "a software engineer at a fintech startup",
             "a high-school chemistry teacher", "a barista at a neighbourhood cafe",
             "an accountant at a big audit firm", "a graphic designer at an ad agency", "a paralegal at a law firm",
             "a line cook at an Italian restaurant", "a data analyst at an insurance company", "a pharmacist",
             "a real-estate agent", "a junior architect"],
    "partners": ["Daniel", "Sophie", "Marcus", "Chloe", "Ethan", "Priya", "Leo", "Hannah", "Omar", "Grace",
                 "Lucas", "Mia"],
    "tastes": {
        "drink": (["mocha", "matcha lattes", "black coffee", "oolong tea", "bubble tea", "flat whites"],
                  ["Loves {x}; orders one almost every day", "Favourite drink is {x}"],
                  ["Has switched to {x} lately", "These days always orders {x}"],
                  ["I need something to drink to get through this afternoon.",
                   "What's my usual order at a cafe again?"]),
        "music": (["jazz", "K-pop", "heavy metal", "classical piano", "indie folk", "hip-hop"],
                  ["Listens to {x} all the time", "Favourite music is {x}"],
                  ["Has been obsessed with {x} recently", "Got really into {x} lately"],
                  ["Recommend me something to listen to tonight.", "What kind of music am I into these days?"]),
        "food": (["spicy Sichuan food", "sushi", "vegan food", "Neapolitan pizza", "Korean barbecue", "ramen"],
                 ["Favourite food is {x}", "Could eat {x} every day"],
                 ["Now mostly craves {x}", "Has recently fallen in love with {x}"],
                 ["What should I have for dinner tonight?", "I'm picking a restaurant for Friday."]),
    },
    "children": [("daughter", "Lily"), ("son", "Tom"), ("daughter", "Ava"), ("son", "Ben"), ("daughter", "Zoe"),
                 ("son", "Max")],
    "pets": [("cat", "Mochi"), ("dog", "Biscuit"), ("cat", "Pepper"), ("dog", "Rocky"), ("rabbit", "Clover")],
    "allergies": [("peanuts", "Should I order the peanut satay at the new Thai place?"),
                  ("shellfish", "My friends want to go to a seafood buffet on Saturday."),
                  ("penicillin", "The doctor wants to put me on antibiotics for this infection.")],
    "family": [("Mother keeps pushing {o} to get married, and it really stresses {o} out",
                "Mother likes gardening", "My mom called again tonight."),
               ("Father was diagnosed with early-stage Parkinson's last year",
                "Father collects old stamps", "I'm a bit worried about my dad."),
               ("Older brother has gambling debts and keeps asking {o} for money",
                "Older brother watches a lot of football", "My brother texted me again asking for a favour.")],
    "companies": ["Google", "a design studio", "the city hospital", "a startup downtown", "a big bank"],
    "t": {
        "city_old": ["Lives in {x}", "Has lived in {x} for years and knows every corner of it"],
        "city_new": ["Moved to {x} recently and lives there now", "Just relocated to {x} for a fresh start"],
        "city_dup": "Settled into a new flat in {x}",
        "city_q": ["Do you remember which city I live in now?", "The rent in my city is getting ridiculous.",
                   "Can you suggest a weekend walk near where I live?", "It has been raining in my city all week."],
        "job_old": ["Works as {x}", "Job: {x}"],
        "job_new": ["Quit the old job and now works as {x}", "Started a new job as {x}"],
        "job_q": ["Work was exhausting today.", "Do you remember what I do for a living?",
                  "My manager dumped a new project on me today.", "Should I ask for a raise at my job?"],
        "partner_old": ["Is dating {x}", "Has a partner called {x}"],
        "partner_new": ["Broke up with {y} and is now seeing {x}", "New partner is {x}; they met a few months ago"],
        "partner_q": ["What should I get my partner for our anniversary?", "My partner and I had a small argument.",
                      "Do you remember who I'm dating?"],
        "child": "Has a {k} named {x}, who is in primary school",
        "child_q": ["{x} has a school play tomorrow and I'm nervous for them.",
                    "Any ideas for my kid's birthday party?", "My kid was sick all night."],
        "pet": "Has a {k} named {x}",
        "pet_q": ["{x} knocked over my plant again.", "I need someone to look after my pet this weekend."],
        "allergy": "Is allergic to {x}",
        "anxiety_important": "Has been seeing a therapist for anxiety since last year",
        "anxiety_trivial": "Tried a meditation app once and found it boring",
        "anxiety_q": "I've been feeling really anxious lately.",
        "event_new": "Has a job interview at {x} this Friday",
        "event_old": "Had a job interview at {x} two years ago that went badly",
        "event_q": "I'm so nervous about tomorrow.",
        "rel_song": "Don't forget to send me that song you promised!",
        "rel_song_q": "So where's that song you promised me?",
        "rel_trip": "I'm planning a trip to Iceland in the autumn.",
        "rel_trip_q": "Did I tell you about my travel plans?",
        "rel_moved": "I finally moved to {x}!",
        "rel_chatter": ["Haha that's funny", "Good night, talk tomorrow", "I'm bored today"],
        "distractors": ["Had ramen for lunch", "Watched a documentary about octopuses", "Bought new running shoes",
                        "Complained about the humid weather", "Played board games with friends on Saturday",
                        "Finished reading a mystery novel", "Best friend {f} moved to {c2}",
                        "Visited {c3} on holiday three years ago", "Cousin works as {j2}",
                        "Best friend just started dating someone new", "Tried {d2} once and did not like it",
                        "Went to a friend's school reunion", "Watched a play on TV last night"],
        "friends": ["Anna", "Jake", "Nina", "Sam", "Ivy", "Oscar"],
        # Update chains A -> B -> C, one topic per user; queries after C, and between B and C.
        "chains": [
            ("diet", ["Eats a lot of meat and loves a good steak", "Became vegetarian this year",
                      "Has gone fully vegan now, no dairy or eggs either"],
             ["I'm cooking for myself tonight, any ideas?", "What do I eat these days?"]),
            ("commute", ["Drives to work every day", "Sold the car and takes the subway to work now",
                         "Cycles to work every day now"],
             ["My commute this morning was awful.", "How do I get to work these days?"]),
            ("exercise", ["Goes to the gym three times a week", "Quit the gym and goes running every morning",
                          "Stopped running after a knee injury and does yoga instead"],
             ["How should I stay fit this week?", "What's my workout routine these days?"]),
        ],
        # The same fact said in three sessions.
        "repeats": [
            (["Is training for a marathon in the spring", "Still training hard for the spring marathon",
              "Marathon training is going well; the race is in the spring"],
             "My legs are so sore from this morning's training run."),
            (["Is learning Japanese", "Keeps studying Japanese every evening",
              "Still learning Japanese, a little every night"],
             "Can you help me practise the language I'm studying?"),
            (["Is saving up to buy a flat", "Still saving money every month for a flat of their own",
              "Putting money aside every month to buy a flat"],
             "Should I splurge on a new phone this month?"),
        ],
        # Traps: a newer related memory that contradicts nothing (category of the new row).
        "trap_pet": ("Adopted a second {k}, Luna, who gets along with {x}", "fact"),
        "trap_pet_q": "{x} has been hiding under the bed all day, should I worry?",
        "trap_allergy": ("Found out {o} is also allergic to cats", "fact"),
        "trap_allergy_q": {"peanuts": "Can I eat the peanut butter cookies my coworker baked?",
                           "shellfish": "Is it OK for me to try the shrimp dumplings at the new place?",
                           "penicillin": "The pharmacist offered me amoxicillin for my sore throat."},
        "trap_child": ("{x} lost a first tooth this week", "event"),
        "trap_child_q": "Do you remember my kid's name? I told you about them ages ago.",
    },
}

# --- Chinese ----------------------------------------------------------------------------------------
ZH = {
    "names": ["小林", "阿杰", "晓雯", "王磊", "佳佳", "陈浩", "思思", "刘洋", "婷婷", "张伟", "美琪", "子轩"],
    "cities": ["上海", "北京", "深圳", "成都", "杭州", "广州", "南京", "西安", "武汉", "重庆", "苏州", "厦门",
               "东京", "新加坡", "大理", "青岛"],
    "jobs": ["儿童医院的护士", "金融科技公司的程序员", "高中化学老师", "社区咖啡店的咖啡师", "会计师事务所的审计",
             "广告公司的平面设计师", "律所的律师助理", "意大利餐厅的厨师", "保险公司的数据分析师", "药剂师",
             "房产中介", "建筑设计院的助理建筑师"],
    "partners": ["阿明", "小雨", "大伟", "林琳", "浩然", "周婷", "刘星", "赵敏", "孙凯", "吴佳", "郑宇", "何静"],
    "tastes": {
        "drink": (["摩卡", "抹茶拿铁", "美式咖啡", "乌龙茶", "珍珠奶茶", "燕麦拿铁"],
                  ["很爱喝{x}，几乎每天一杯", "最喜欢的饮料是{x}"],
                  ["最近改喝{x}了", "现在每次都点{x}"],
                  ["下午好困，想喝点东西提提神。", "我去咖啡店一般点什么来着？"]),
        "music": (["爵士乐", "韩流音乐", "重金属", "古典钢琴", "民谣", "说唱"],
                  ["平时一直听{x}", "最喜欢的音乐是{x}"],
                  ["最近迷上了{x}", "这阵子天天循环{x}"],
                  ["今晚推荐点音乐给我听吧。", "我最近喜欢听什么音乐来着？"]),
        "food": (["川菜", "日料", "素食", "火锅", "韩式烤肉", "拉面"],
                 ["最爱吃{x}", "天天吃{x}都不腻"],
                 ["最近特别想吃{x}", "最近爱上了{x}"],
                 ["今晚吃什么好呢？", "周五想订个餐厅，帮我想想。"]),
    },
    "children": [("女儿", "朵朵"), ("儿子", "乐乐"), ("女儿", "小满"), ("儿子", "豆豆"), ("女儿", "甜甜"),
                 ("儿子", "球球")],
    "pets": [("猫", "年糕"), ("狗", "旺财"), ("猫", "汤圆"), ("狗", "可乐"), ("兔子", "团子")],
    "allergies": [("花生", "新开的泰国餐厅有花生沙爹，要不要点？"),
                  ("海鲜", "朋友们周六约我去吃海鲜自助。"),
                  ("青霉素", "医生说要给我开抗生素治这个感染。")],
    "family": [("妈妈一直催{o}结婚，让{o}压力很大", "妈妈喜欢养花", "我妈今晚又打电话来了。"),
               ("爸爸去年被诊断出早期帕金森", "爸爸喜欢集邮", "我有点担心我爸。"),
               ("哥哥欠了赌债，经常找{o}借钱", "哥哥爱看足球", "我哥又发消息找我帮忙了。")],
    "companies": ["腾讯", "一家设计工作室", "市中心医院", "一家创业公司", "一家大银行"],
    "t": {
        "city_old": ["住在{x}", "在{x}住了很多年，对那里很熟"],
        "city_new": ["最近搬到了{x}，现在住在那里", "刚搬去{x}，想重新开始"],
        "city_dup": "在{x}租了新房子",
        "city_q": ["你还记得我现在住在哪个城市吗？", "我这边的房租越来越贵了。", "周末想在家附近散散步，有什么推荐？",
                   "我这里已经连续下了一周的雨。"],
        "job_old": ["工作是{x}", "职业：{x}"],
        "job_new": ["辞掉了原来的工作，现在是{x}", "换了新工作，现在是{x}"],
        "job_q": ["今天上班累死了。", "你还记得我是做什么工作的吗？", "领导今天又给我派了个新项目。",
                  "我要不要跟公司提涨薪？"],
        "partner_old": ["在和{x}交往", "对象叫{x}"],
        "partner_new": ["和{y}分手了，现在在和{x}交往", "新对象是{x}，几个月前认识的"],
        "partner_q": ["纪念日快到了，送对象什么礼物好？", "我和对象吵了一架。", "你还记得我现在在和谁交往吗？"],
        "child": "有一个{k}叫{x}，在上小学",
        "child_q": ["{x}明天学校有演出，我好紧张。", "想给孩子办个生日派对，有什么主意？", "孩子昨晚发烧闹了一夜。"],
        "pet": "养了一只{k}，叫{x}",
        "pet_q": ["{x}又把我的花盆打翻了。", "这周末要找人帮我照看宠物。"],
        "allergy": "对{x}过敏",
        "anxiety_important": "去年开始因为焦虑一直在看心理咨询师",
        "anxiety_trivial": "试过一次冥想App，觉得很无聊",
        "anxiety_q": "最近总是很焦虑。",
        "event_new": "这周五要去{x}面试",
        "event_old": "两年前在{x}面试过，结果很糟",
        "event_q": "明天好紧张啊。",
        "rel_song": "别忘了把你答应我的那首歌发给我！",
        "rel_song_q": "你答应我的那首歌呢？",
        "rel_trip": "我打算秋天去冰岛旅行。",
        "rel_trip_q": "我跟你说过我的旅行计划吗？",
        "rel_moved": "我终于搬到{x}啦！",
        "rel_chatter": ["哈哈好好笑", "晚安，明天聊", "今天好无聊"],
        "distractors": ["午饭吃了拉面", "看了一部关于章鱼的纪录片", "买了一双新跑鞋", "抱怨天气太潮湿",
                        "周六和朋友玩了桌游", "看完了一本推理小说", "好朋友{f}搬去了{c2}", "三年前去{c3}旅游过",
                        "表姐的工作是{j2}", "好朋友最近开始谈恋爱了", "试过一次{d2}，不喜欢",
                        "参加了朋友的同学聚会", "昨晚在电视上看了一场话剧"],
        "friends": ["安娜", "小杰", "妮妮", "阿森", "小艾", "奥斯卡"],
        "chains": [
            ("diet", ["很爱吃肉，尤其喜欢牛排", "今年开始吃素了", "现在完全吃纯素，连蛋和奶都不吃了"],
             ["今晚自己做饭，有什么建议？", "我现在平时吃什么来着？"]),
            ("commute", ["每天开车上班", "把车卖了，现在坐地铁上班", "现在每天骑自行车上班"],
             ["今天早上通勤太痛苦了。", "我现在是怎么去上班的？"]),
            ("exercise", ["每周去健身房三次", "不去健身房了，改成每天早上跑步", "膝盖受伤后不跑步了，改练瑜伽"],
             ["这周该怎么锻炼身体？", "我最近的运动习惯是什么？"]),
        ],
        "repeats": [
            (["在准备春天的马拉松", "还在为春天的马拉松努力训练", "马拉松训练很顺利，比赛在春天"],
             "今天早上训练跑完腿好酸。"),
            (["在学日语", "每天晚上都坚持学日语", "还在学日语，每晚学一点"],
             "能帮我练练我在学的那门语言吗？"),
            (["在攒钱买房", "每个月还在存钱，想买自己的房子", "每个月都存一笔钱准备买房"],
             "这个月要不要狠心买个新手机？"),
        ],
        "trap_pet": ("又领养了一只{k}，叫露娜，和{x}相处得很好", "fact"),
        "trap_pet_q": "{x}一整天都躲在床底下，我要担心吗？",
        "trap_allergy": ("发现{o}对猫也过敏", "fact"),
        "trap_allergy_q": {"花生": "同事烤的花生酱饼干我能吃吗？",
                          "海鲜": "新开的那家店的虾饺我能尝尝吗？",
                          "青霉素": "药剂师给我推荐了阿莫西林治嗓子疼。"},
        "trap_child": ("{x}这周掉了第一颗牙", "event"),
        "trap_child_q": "你还记得我孩子叫什么名字吗？我很久以前跟你说过。",
    },
}

# The category dreaming would give each distractor template above (same order in both languages).
DISTRACTOR_CATEGORIES = ["event", "event", "event", "emotion", "event", "event", "relation", "event", "relation",
                         "relation", "preference", "event", "event"]
OBJECT = {"en": ("her", "him"), "zh": ("她", "他")}


def build() -> tuple[list[dict], list[dict]]:
    rng = random.Random(20260501)
    memories: list[dict] = []
    queries: list[dict] = []
    for lang, L in (("en", EN), ("zh", ZH)):
        t = L["t"]
        for n in range(12):
            uid = f"{lang}{n:02d}"
            at = ANCHOR + timedelta(days=n * 3, hours=n)
            obj = OBJECT[lang][n % 2]
            mems: dict[str, dict] = {}
            labels: dict[str, dict] = {}  # memory key -> truth labels, merged in at the end

            def mem(key, content, category, importance, age_days, layer="profile"):
                m = {"id": f"{uid}-{key}", "user_id": uid, "content": content, "category": category,
                     "importance": importance, "created_at": (at - timedelta(days=age_days)).isoformat(),
                     "layer": layer}
                if layer == "relationship":
                    m["category"] = None
                    m["importance"] = None
                elif rng.random() < 0.1:
                    m["importance"] = None  # written before extraction gave importance
                mems[key] = m
                return m["id"]

            def query(text, relevant, tags, superseded=(), when=at):
                queries.append({"id": f"{uid}-q{len([q for q in queries if q['user_id'] == uid]):02d}",
                                "user_id": uid, "text": text, "at": when.isoformat(), "relevant_ids": relevant,
                                "superseded_ids": list(superseded), "tags": [lang, *tags]})

            pick = rng.sample
            city_old, city_new, c2, c3 = pick(L["cities"], 4)
            job_old, job_new, j2 = pick(L["jobs"], 3)
            partner_old, partner_new = pick(L["partners"], 2)
            taste_kind = ("drink", "music", "food")[n % 3]
            values, old_t, new_t, taste_qs = L["tastes"][taste_kind]
            taste_old, taste_new, d2 = pick(values, 3)
            kid_kind, kid = L["children"][n % len(L["children"])]
            pet_kind, pet = L["pets"][n % len(L["pets"])]
            allergen, allergy_q = L["allergies"][n % len(L["allergies"])]
            fam_important, fam_trivial, fam_q = L["family"][n % len(L["family"])]
            company_new, company_old = pick(L["companies"], 2)
            friend = rng.choice(t["friends"])

            # Knowledge updates: new fact 3-200 days old, old fact 60-500 days older.
            def update(topic, old_text, new_text, imp, *, dup=None):
                new_age = rng.choice([rng.uniform(3, 30), rng.uniform(30, 90), rng.uniform(90, 200)])
                old_age = new_age + rng.uniform(60, 500)
                ids_old = [mem(f"{topic}-old", old_text, "fact" if topic != "taste" else "preference", imp,
                               old_age)]
                ids_new = [mem(f"{topic}-new", new_text, "fact" if topic != "taste" else "preference", imp,
                               new_age)]
                labels[f"{topic}-new"] = {"supersedes": ids_old}
                if dup:
                    ids_new.append(mem(f"{topic}-new2", dup, "fact", imp, max(1.0, new_age - rng.uniform(1, 20))))
                    # A restatement of the new fact: a correct consolidation adds no row.
                    labels[f"{topic}-new"]["fact"] = f"{uid}-{topic}-current"
                    labels[f"{topic}-new2"] = {"same_as": ids_new[0], "fact": f"{uid}-{topic}-current"}
                return ids_old, ids_new, new_age

            c_old, c_new, city_age = update("city", rng.choice(t["city_old"]).format(x=city_old),
                                            rng.choice(t["city_new"]).format(x=city_new),
                                            round(rng.uniform(0.6, 0.8), 2),
                                            dup=t["city_dup"].format(x=city_new) if n % 2 == 0 else None)
            moved = mem("rel-moved", t["rel_moved"].format(x=city_new), None, None, city_age, "relationship")
            j_old, j_new, _ = update("job", rng.choice(t["job_old"]).format(x=job_old),
                                     rng.choice(t["job_new"]).format(x=job_new), round(rng.uniform(0.6, 0.8), 2))
            p_old, p_new, _ = update("partner", rng.choice(t["partner_old"]).format(x=partner_old),
                                     rng.choice(t["partner_new"]).format(x=partner_new, y=partner_old),
                                     round(rng.uniform(0.7, 0.9), 2))
            t_old, t_new, _ = update("taste", rng.choice(old_t).format(x=taste_old),
                                     rng.choice(new_t).format(x=taste_new), round(rng.uniform(0.3, 0.5), 2))

            # Stable facts, said long ago.
            kid_id = mem("child", t["child"].format(k=kid_kind, x=kid), "relation", 0.9, rng.uniform(300, 900))
            pet_id = mem("pet", t["pet"].format(k=pet_kind, x=pet), "fact", 0.6, rng.uniform(200, 700))
            allergy_id = mem("allergy", t["allergy"].format(x=allergen), "fact", 0.8, rng.uniform(200, 800))
            # Important versus trivial, same topic.
            fam_id = mem("family-important", fam_important.format(o=obj), "relation", 0.9, rng.uniform(60, 400))
            mem("family-trivial", fam_trivial, "relation", 0.2, rng.uniform(5, 60))
            anx_id = mem("anxiety-important", t["anxiety_important"], "emotion", 0.85, rng.uniform(100, 400))
            mem("anxiety-trivial", t["anxiety_trivial"], "event", 0.15, rng.uniform(2, 40))
            # A recent event and an old one like it.
            ev_new = mem("event-new", t["event_new"].format(x=company_new), "event", 0.7, rng.uniform(1, 4))
            mem("event-old", t["event_old"].format(x=company_old), "event", 0.4, rng.uniform(500, 800))
            # Relationship layer.
            song = mem("rel-song", t["rel_song"], None, None, rng.uniform(5, 60), "relationship")
            trip = mem("rel-trip", t["rel_trip"], None, None, rng.uniform(10, 120), "relationship")
            for i, chatter in enumerate(t["rel_chatter"]):
                mem(f"rel-chatter{i}", chatter, None, None, rng.uniform(0, 30), "relationship")
            # Distractors.
            for i, d in enumerate(t["distractors"]):
                text = d.format(f=friend, c2=c2, c3=c3, j2=j2, d2=d2)
                mem(f"distractor{i}", text, DISTRACTOR_CATEGORIES[i], round(rng.uniform(0.1, 0.4), 2),
                    rng.uniform(0, 60))

            # Queries.
            for q in rng.sample(t["city_q"], 2):
                query(q, c_new + [moved], ["update", "city"], c_old)
            # Asked before the move: the old city is the answer, the new one does not exist yet.
            before = at - timedelta(days=city_age + rng.uniform(5, 40))
            query(rng.choice(t["city_q"]), c_old, ["as_of", "city"], when=before)
            for q in rng.sample(t["job_q"], 2):
                query(q, j_new, ["update", "job"], j_old)
            query(rng.choice(t["partner_q"]), p_new, ["update", "partner"], p_old)
            query(rng.choice(taste_qs), t_new, ["update", "taste"], t_old)
            query(rng.choice(t["child_q"]).format(x=kid), [kid_id], ["stable", "child"])
            query(rng.choice(t["pet_q"]).format(x=pet), [pet_id], ["stable", "pet"])
            query(allergy_q, [allergy_id], ["stable", "allergy"])
            query(fam_q, [fam_id], ["importance", "family"])
            query(t["anxiety_q"], [anx_id], ["importance", "anxiety"])
            query(t["event_q"], [ev_new], ["event"])  # ev_old: a look-alike, not a superseded fact
            query(t["rel_song_q"], [song], ["relationship"])
            query(t["rel_trip_q"], [trip], ["relationship"])

            # --- what consolidation must get right and must not break (its own random stream) ----------
            rng2 = random.Random(f"consolidation-{uid}")

            def mem2(key, content, category, importance, age_days, **label):
                m = {"id": f"{uid}-{key}", "user_id": uid, "content": content, "category": category,
                     "importance": importance, "created_at": (at - timedelta(days=age_days)).isoformat(),
                     "layer": "profile"}
                mems[key] = m
                if label:
                    labels[key] = label
                return m["id"]

            # Update chain A -> B -> C: C 5-60 days old, B 60-300 days before it, A 100-400 before B.
            _, (a_text, b_text, c_text), chain_qs = t["chains"][n % 3]
            c_age = rng2.uniform(5, 60)
            b_age = c_age + rng2.uniform(60, 300)
            a_age = b_age + rng2.uniform(100, 400)
            imp = round(rng2.uniform(0.5, 0.7), 2)
            chain_a = mem2("chain-a", a_text, "fact", imp, a_age)
            chain_b = mem2("chain-b", b_text, "fact", imp, b_age, supersedes=[chain_a])
            chain_c = mem2("chain-c", c_text, "fact", imp, c_age, supersedes=[chain_b, chain_a])
            for q in chain_qs:
                query(q, [chain_c], ["update", "chain"], [chain_b, chain_a])
            between = at - timedelta(days=rng2.uniform(c_age + 2, b_age - 2))
            query(rng2.choice(chain_qs), [chain_b], ["as_of", "chain"], [chain_a], when=between)

            # The same fact in three sessions, 150-300, 60-150 and 3-60 days ago.
            texts, repeat_q = t["repeats"][n % 3]
            fact = f"{uid}-repeat"
            imp = round(rng2.uniform(0.5, 0.7), 2)
            first = mem2("repeat-1", texts[0], "event", imp, rng2.uniform(150, 300), fact=fact)
            copies = [first] + [mem2(f"repeat-{i + 2}", text, "event", imp, age, fact=fact, same_as=first)
                                for i, (text, age) in enumerate(zip(texts[1:], (rng2.uniform(60, 150),
                                                                               rng2.uniform(3, 60))))]
            query(repeat_q, copies, ["repeat"])

            # Traps: newer, related, contradicting nothing (related_to, no supersedes: a correct consolidation
            # keeps both).
            text, category = t["trap_pet"]
            mem2("trap-pet", text.format(k=pet_kind, x=pet), category, 0.5, rng2.uniform(5, 90),
                 related_to=[pet_id])
            query(t["trap_pet_q"].format(x=pet), [pet_id], ["stable", "trap", "pet"])
            text, category = t["trap_allergy"]
            mem2("trap-allergy", text.format(o=obj), category, 0.7, rng2.uniform(5, 120),
                 related_to=[allergy_id])
            query(t["trap_allergy_q"][allergen], [allergy_id], ["stable", "trap", "allergy"])
            text, category = t["trap_child"]
            mem2("trap-child", text.format(x=kid), category, 0.5, rng2.uniform(2, 30), related_to=[kid_id])
            query(t["trap_child_q"], [kid_id], ["stable", "trap", "child"])

            for key, label in labels.items():
                mems[key].update(label)
            memories.extend(mems.values())
    return memories, queries


def main() -> None:
    memories, queries = build()
    OUT.mkdir(parents=True, exist_ok=True)
    for name, rows in (("memories", memories), ("queries", queries)):
        with open(OUT / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{len(memories)} memories, {len(queries)} queries -> {OUT}")


if __name__ == "__main__":
    main()
