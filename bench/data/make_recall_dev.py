"""Writes the recall dev set (bench/data/recall_dev/{memories,queries}.jsonl), keeping known embeddings.

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

What the lexical part of recall is for (issue 14), drawn from a third random stream per user and
appended after every row and query above (which keep their text, dates, ids and embeddings): rows
a companion must get exactly right and embeddings blur, each among look-alikes of the same user
and category that only the name, word, number or date tells apart, and queries (tag ``lexical``
on all of them) that hinge on it:

* ``name``: four people in one role (colleagues, neighbours, carers, a book club) with unusual
  names ("Mehmet", "Oksana", "卓玛", "欧阳晨"), and three places of one kind (cafés, streets, small
  towns, brands); "How is Mehmet doing?", "婺源今天上新闻了！";
* ``rare``: two rare hobbies, instruments or medicines (kintsugi, the bandoneon, levothyroxine,
  金缮, 中阮, 优甲乐) next to two ordinary ones;
* ``number``: four bus lines ("the 47", "47路") or four sizes (shoe size, jeans, ring, glasses,
  height); asked with the number or for it ("我的鞋码是多少？");
* ``date``: four events with their event time (``occurred_at`` and ``occurred_precision``: day,
  week, month or year), said as "in 2019", "in March 2016", "on 14 March", "last week", "last
  year" or not at all in the text (the year only in ``occurred_at``); asked by their period
  ("What happened in 2019?", the only row of that period) and asked when ("When did I get my
  driving licence?");
* ``paraphrase``: one query per user about a look-alike without its distinguishing word (a
  control: lexical evidence must not hurt it);
* ``lexical_trap``: three per user, a query that shares a word with a memory meaning something
  else ("bank" of a river, "Java" the island, "Rose" a cousin, 苹果 the fruit, 小米 the brand,
  打篮球 for 打针), while the relevant memory says it in other words: the lexical weight must not win.

New queries list the look-alikes in ``lookalike_ids`` (the trap row for a trap), for reading results.

Each query also carries ``tags`` (``update``, ``stable``, ``importance``, ``event``,
``relationship``, ``as_of``, ``chain``, ``repeat``, ``trap``, ``lexical``, ``name``, ``rare``,
``number``, ``date``, ``paraphrase``, ``lexical_trap``, ``en``/``zh``) for the per-slice tables of
bench/recall_eval.py.

The files are rewritten with the embedding of every row whose text did not change (read back by
id), so only new or changed rows need one:

    .venv/bin/python bench/data/make_recall_dev.py      # then bench/embed_recall_dev.py embeds the new rows
"""

from __future__ import annotations

import json
import random
import re
from datetime import date, datetime, timedelta, timezone
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
POSSESSIVE = {"en": ("her", "his"), "zh": ("她", "他")}

# --- What the lexical part of recall is for (issue 14), per language --------------------------------
# Every group below is a set of look-alikes of one user and one category: semantically close, told apart
# only by a name, a rare word, a number or a date. ``topic`` keeps two groups that would answer each
# other's queries away from one user; ``avoid`` skips an item for a user whose earlier rows contain one of
# the strings (e.g. no bus lines for someone whose commute chain takes the subway).
SOFTWARE_JOB = ["Works as a software", "now works as a software", "Job: a software", "job as a software"]  # not cousins
LEX_EN = {
    "people": ["Mehmet", "Oksana", "Thabo", "Siobhan", "Dagny", "Tarek", "Ingrid", "Kofi", "Yusuf", "Leilani",
               "Bartek", "Anouk", "Teodora", "Ifeoma", "Søren", "Zainab", "Wojciech", "Ximena", "Radu", "Nkechi"],
    # (category, [(fact about {x}, the same person described without the name)], queries naming {x})
    "roles": [
        ("relation",
         [("{x}, a colleague, just had a baby and is on parental leave",
           "How's my coworker with the new baby getting on?"),
          ("Colleague {x} is going through a messy divorce",
           "My coworker whose marriage is falling apart looked so down today."),
          ("{x} from work was promoted to team lead last month",
           "Should I congratulate the coworker who just got moved up to run the team?"),
          ("Colleague {x} is organising the office move to the new building",
           "Who was in charge of moving us to the new offices again?"),
          ("{x} at work brings homemade baklava every Friday",
           "Who's the coworker who bakes for everyone at the end of the week?")],
         ["How is {x} doing?", "I had lunch with {x} today.", "{x} asked me for a favour at work.",
          "I'm meeting {x} tomorrow, anything I should remember?", "Remind me what's going on with {x}."]),
        ("relation",
         [("Neighbour {x} practises the trumpet late at night",
           "My neighbour with the brass instrument was at it again at midnight."),
          ("Neighbour {x} had knee surgery and struggles with the stairs",
           "Should I offer to carry the shopping up for the neighbour who had the operation?"),
          ("Neighbour {x} runs the bakery on the corner",
           "What's the name of the neighbour who owns the bread shop?"),
          ("Neighbour {x} keeps leaving notes about the bins",
           "My neighbour left another passive-aggressive note about the rubbish."),
          ("Downstairs neighbour {x} is a retired sea captain full of stories",
           "The old sailor downstairs told me another story today.")],
         ["{x} knocked on my door this morning.", "Haven't seen {x} around for a while.",
          "{x} asked me to water the plants next week.",
          "Bumped into {x} on the stairs, what should I ask about next time?"]),
        ("fact",
         [("{x} is {p} GP and always takes time to listen", "I should book a check-up with my family doctor."),
          ("Sees a dentist called {x} about a cracked molar", "My tooth is hurting again, who was fixing it?"),
          ("Sees a physiotherapist called {x} for a sore shoulder",
           "My shoulder's bad again, should I go back to the person treating it?"),
          ("Dermatologist {x} is treating {p} eczema", "The rash on my hands is back."),
          ("Sees an osteopath called {x} for back pain", "My back is killing me, who was I seeing for it?")],
         ["I have an appointment with {x} tomorrow.", "{x} cancelled on me again.",
          "Do I need to bring anything when I see {x} on Monday?", "What was I seeing {x} for again?"]),
        ("relation",
         [("{x} from the book club is emigrating to New Zealand next year",
           "A friend from my reading group is moving abroad for good, I'll miss them."),
          ("{x} from the book club always picks enormous Russian novels",
           "Who in my reading group keeps choosing those huge Russian books?"),
          ("{x}, who hosts the book club, just got engaged",
           "The friend who has the reading group at their place is getting married!"),
          ("{x} from the book club lent {o} a signed first edition", "I still have that signed book a friend lent me."),
          ("{x} from the book club works night shifts at the airport",
           "My reading-group friend who works nights can never make the evening meetings.")],
         ["{x} texted me about the next meeting.", "Haven't heard from {x} in ages.", "Is {x} coming on Thursday?",
          "I'm having coffee with {x} on Sunday."]),
    ],
    # (category, topic, [(memory, query naming the place)])
    "places": [
        ("preference", "cafe",
         [("Likes working from Café Mirabelle by the station", "Thinking of spending tomorrow morning at Mirabelle."),
          ("Meets friends at Tamarind, a little café near the park", "Tamarind has a new cake on the menu, apparently."),
          ("Picks up a coffee at Ziggy's on the way home", "Ziggy's got my order wrong again."),
          ("Reads on Sunday mornings at the Blue Heron café by the canal", "The Blue Heron was closed today, so sad.")]),
        ("fact", "street",
         [("Buys flowers from a stall on Larch Street", "Larch Street is closed for roadworks all week."),
          ("Gets {p} hair cut at a salon on Marlowe Road", "There was a fire on Marlowe Road last night!"),
          ("Has a favourite second-hand bookshop on Crispin Lane",
           "They're putting up a new block of flats on Crispin Lane."),
          ("Walks through Abbot's Yard to get to the market", "Abbot's Yard looked so pretty in the snow today.")]),
        ("fact", "town",
         [("Grew up in Hebden Bridge, a small town in Yorkshire", "Hebden Bridge was on the news tonight!"),
          ("Spent childhood summers in Aberaeron, a seaside town in Wales",
           "Someone at work has just been to Aberaeron on holiday."),
          ("Grandparents came from Tobermory on the Isle of Mull", "I found an old postcard from Tobermory."),
          ("Goes back to Kinsale, a fishing town in Ireland, every summer",
           "Kinsale made a list of the prettiest towns in Europe!")]),
        ("preference", "shopping",
         [("Swears by Muji notebooks for journalling", "Muji is having a sale, should I stock up?"),
          ("Wears Birkenstocks all summer long", "My Birkenstocks finally fell apart."),
          ("Cooks nearly everything in a big Le Creuset pot", "I chipped the Le Creuset, I'm gutted."),
          ("Reads everything on a battered old Kindle", "My Kindle won't charge any more.")]),
    ],
    # (category, topic, [(memory, query with the rare word, the same without it or None)], look-alikes)
    "rare": [
        ("preference", "craft",
         [("Has taken up kintsugi, mending broken bowls with gold lacquer", "I finally finished my first kintsugi piece!",
           "I glued that broken cup back together with the gold stuff and it looks amazing."),
          ("Is learning sashiko, the Japanese running stitch, on old jeans", "Where can I buy proper sashiko thread?",
           None),
          ("Does pyrography, burning patterns into wood", "My pyrography pen died halfway through a project.",
           "I want to make a wooden sign for a friend with my wood-burning tool."),
          ("Has got into macramé and knots plant hangers", "I need more cord for my macramé wall hanging.", None),
          ("Does lino printing at weekends and makes {p} own cards", "I cut my finger on the lino gouge, ouch.",
           "I want to carve a new block to print birthday cards.")],
         ["Did a pottery taster class once", "Likes knitting scarves in winter", "Paints watercolours now and then",
          "Does a jigsaw puzzle most weekends", "Sews {p} own cushion covers"]),
        ("preference", "instrument",
         [("Plays the oud in a small folk ensemble", "I need new strings for my oud.", None),
          ("Is learning the theremin, the instrument you play without touching it",
           "My theremin hums whenever the fridge is on.",
           "That instrument I play by waving my hands picked up static again."),
          ("Plays the bandoneon in a tango orchestra", "The bellows on my bandoneon are leaking.",
           "My tango orchestra has a gig next month, I'm nervous."),
          ("Has started playing the hurdy-gurdy", "The crank on my hurdy-gurdy squeaks.", None),
          ("Plays the kalimba before bed", "Teach me a new tune for the kalimba?",
           "I want to learn a lullaby on my little thumb piano.")],
         ["Played the recorder at school", "Would like to learn the guitar one day", "Sings in the shower every morning",
          "Had piano lessons as a child", "Has a keyboard gathering dust in the corner"]),
        ("fact", "medicine",
         [("Takes levothyroxine every morning for an underactive thyroid",
           "I forgot my levothyroxine this morning, is that bad?", "I keep forgetting my thyroid pill."),
          ("Uses a salbutamol inhaler for asthma", "My salbutamol is almost empty.",
           "My chest feels tight, where did I put my asthma puffer?"),
          ("Takes omeprazole for acid reflux", "Can I take omeprazole with coffee?",
           "Heartburn kept me up all night again."),
          ("Takes sumatriptan when a migraine starts", "Is it OK to take sumatriptan twice in one day?", None),
          ("Takes metformin for prediabetes", "Should I take my metformin before or after dinner?", None)],
         ["Takes vitamin D in winter", "Takes ibuprofen for the odd headache", "Drinks chamomile tea to sleep better",
          "Takes a magnesium supplement at night", "Keeps antihistamines for hay fever"]),
    ],
    "bus": {
        "memory": "Takes the {x} bus to {d}",
        "lines": ["7", "12", "19", "23", "38", "47", "55", "61", "73", "88", "104", "305"],
        "dests": [("{p} grandmother's on Sundays", "Which bus do I take to my grandma's?"),
                  ("the Saturday farmers' market", "Which bus goes to the farmers' market?"),
                  ("the big library in town", "What bus do I need for the library?"),
                  ("the swimming pool", "Which bus was it to the pool?"),
                  ("the airport", "Which bus goes to the airport again?")],
        "queries": ["The {x} was late again this morning.", "Is the {x} still running on Sundays?",
                    "What time does the {x} usually come?", "Missed the {x} by ten seconds, ugh."],
        "avoid": ["subway"],
    },
    # (memory, values, query asking for the number, query with the number or None); the first is always used.
    "sizes": [
        ("Wears size {x} shoes", ["37", "38", "39", "41", "42", "44"],
         "What's my shoe size again? I'm ordering boots online.", "Will a {x} fit me in these trainers?"),
        ("Wears jeans with a {x}-inch waist", ["28", "30", "32", "34"], "What size jeans should I order?", None),
        ("Ring size is {x}", ["6", "6.5", "7", "8"], "I'm getting a ring resized, what's my size?", None),
        ("Glasses prescription is -{x} in both eyes", ["1.50", "2.25", "3.00", "4.50"],
         "What's my glasses prescription? The optician's form asks for it.", None),
        ("Is {x} cm tall", ["158", "163", "172", "181"], "How tall did I say I was?", None),
    ],
    # (memory with {when}, the periods it can be said with, query asking when)
    "dates": [
        ("Got {p} driving licence {when}", ["year", "year_rel", "month"], "When did I get my driving licence?"),
        ("Finally learned to swim {when}", ["year", "year_rel", "month_rel"], "When did I learn to swim?"),
        ("Broke {p} wrist snowboarding {when}", ["year", "month", "year_rel"], "When did I break my wrist?"),
        ("Graduated from university {when}", ["year"], "What year did I graduate?"),
        ("Went to {p} first music festival {when}", ["year", "month"], "When was my first music festival?"),
        ("Started volunteering at the community kitchen {when}", ["month", "month_rel", "week_rel"],
         "When did I start volunteering at the kitchen?"),
        ("Had {p} wisdom teeth out {when}", ["week_rel", "day", "month_rel"], "When did I have my wisdom teeth out?"),
        ("Sang at {p} cousin's wedding {when}", ["day", "month", "year_rel"], "When did I sing at my cousin's wedding?"),
        ("Got a small swallow tattoo {when}", ["year", "month_rel", "day"], "When did I get my tattoo?"),
        ("Went skydiving for the first time {when}", ["day", "year"], "When did I go skydiving?"),
    ],
    "when": {"year": "in {Y}", "year_rel": ("last year", "two years ago"), "month": "in {Mon} {Y}",
             "month_rel": "last month", "week_rel": "last week", "day": "on {D} {Mon}"},
    "date_q": {"year": ["What was I up to in {Y}?", "What happened in {Y}?", "Remind me what I did in {Y}."],
               "month": ["What happened in {Mon} {Y}?", "What was I doing in {Mon} {Y}?"],
               "day": ["What did I do on {D} {Mon}?", "What happened on {D} {Mon}?"]},
    "months": ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
               "November", "December"],
    "relative": {"last week": "week", "last month": "month", "last year": "year"},
    # Lexical traps: (query, (relevant memory, category), (trap memory sharing the query's word, category),
    # avoid, topic). The relevant memory says it in other words.
    "traps": [
        ("I have to call the bank about my overdraft tomorrow.",
         ("Is overdrawn on {p} current account again and stressed about money", "emotion"),
         ("Loves reading on the river bank on Sunday mornings", "preference"), ["saving"], "money"),
        ("My Apple laptop won't turn on and I have a deadline.",
         ("Has a seven-year-old MacBook that keeps crashing", "fact"),
         ("Bakes an apple crumble every Sunday", "preference"), [], "computer"),
        ("Any tips for getting better at Java? The exercises are getting hard.",
         ("Signed up for an evening class to learn to code", "event"),
         ("Spent a month backpacking around Java and Bali after university", "event"), SOFTWARE_JOB, "coding"),
        ("The rose bush I planted is covered in aphids.",
         ("Has a small garden and loves growing flowers", "preference"),
         ("Cousin Rose is studying medicine in Edinburgh", "relation"), [], "garden"),
        ("I'm finally repainting in May, what colour was I going to go for?",
         ("Wants to paint the living room a deep green this spring", "preference"),
         ("Niece May just learned to walk", "relation"), [], "home"),
        ("The Jaguar is making a weird rattling noise again.",
         ("Restored an old British sports car with an uncle and takes it out on sunny weekends", "fact"),
         ("Saw a jaguar on a wildlife trip in Brazil", "event"), ["the car", "Drives"], "car"),
        ("Caught a massive bass this morning!", ("Goes fly fishing most weekends", "preference"),
         ("Plays bass in a covers band", "preference"), [], "fishing"),
        ("My mouse stopped working right before a video call.",
         ("Set up a home office in the spare room with a second-hand computer", "fact"),
         ("Found a mouse in the kitchen last week", "event"), [], "computer"),
        ("I've had a cold for a week and can't shake it.",
         ("Gets ill easily in winter and catches whatever is going round", "fact"),
         ("Swims in the cold sea every New Year's Day", "event"), [], "illness"),
        ("Thinking of a week in Turkey this September.",
         ("Has always wanted to see Istanbul and Cappadocia", "preference"),
         ("Cooks the turkey for the whole family every Christmas", "event"), [], "travel"),
        ("My Amazon parcel has gone missing again.",
         ("Orders nearly everything online and parcels keep getting lost", "fact"),
         ("Dreams of a boat trip down the Amazon", "preference"), [], "parcels"),
        ("I broke one of my good china cups.", ("Collects antique porcelain teacups", "preference"),
         ("Spent a semester studying in China", "event"), [], "craft"),
        ("That crane outside my window starts beeping at 7 am.",
         ("Building work next door wakes {o} up at dawn", "emotion"),
         ("Saw a crane nesting by the lake on a birdwatching trip", "event"), [], "noise"),
        ("My bat snapped at practice today.", ("Plays cricket for the village team on Saturdays", "preference"),
         ("A bat flew into the bedroom last summer", "event"), ["gym"], "sport"),
        ("My Python script keeps crashing on the same line.",
         ("Is teaching {o}self to code to automate spreadsheets", "fact"),
         ("Saw a huge python at the reptile house and still talks about it", "event"), SOFTWARE_JOB, "coding"),
    ],
}

LEX_ZH = {
    "people": ["卓玛", "巴特尔", "古丽娜", "欧阳晨", "司马悦", "慕容雪", "尉迟峰", "皇甫云", "热合曼", "乌兰", "达瓦",
               "其其格", "诸葛青", "上官婷", "Oksana", "Mehmet", "Thabo", "Ingrid"],
    "roles": [
        ("relation",
         [("同事{x}刚有了宝宝，在休育儿假", "那个刚生了宝宝的同事最近还好吗？"),
          ("同事{x}正在闹离婚，状态很差", "那个婚姻出了问题的同事今天看起来好消沉。"),
          ("{x}上个月升成了组长", "刚升职带团队的那位同事，我要不要去祝贺一下？"),
          ("同事{x}在负责公司搬新办公楼的事", "搬新办公室的事是谁在管来着？"),
          ("同事{x}每周五都带自己做的点心来分", "每周给大家带吃的那个同事叫什么来着？")],
         ["{x}最近怎么样？", "今天和{x}一起吃了午饭。", "{x}找我帮个忙。", "明天要跟{x}开会，有什么要注意的吗？",
          "明天又要跟{x}开会了。"]),
        ("relation",
         [("邻居{x}晚上经常练小号", "隔壁那个吹号的半夜又开始了。"),
          ("邻居{x}做了膝盖手术，上下楼不方便", "要不要帮刚做完手术的邻居把菜拎上楼？"),
          ("邻居{x}在街角开了一家面包店", "楼下开面包店的邻居叫什么来着？"),
          ("邻居{x}老为垃圾分类的事贴纸条", "那个老管垃圾分类的邻居又贴纸条了。"),
          ("楼下的邻居{x}是退休的老船长，故事特别多", "楼下那位老船长今天又给我讲故事了。")],
         ["{x}今天早上来敲我家门了。", "好久没见到{x}了。", "{x}托我下周帮忙浇花。", "在楼道里碰到{x}了，下次该聊点什么？"]),
        ("fact",
         [("{x}是{o}的家庭医生，很有耐心", "该找我的家庭医生做个体检了。"),
          ("牙医{x}在帮{o}补一颗裂了的牙", "牙又疼了，之前是谁在帮我补的？"),
          ("康复师{x}在帮{o}治肩膀", "肩膀又疼了，要不要回去找给我做康复的那位？"),
          ("皮肤科的{x}医生在给{o}治湿疹", "手上的疹子又起来了。"),
          ("在找一位叫{x}的正骨师看腰", "腰疼得要命，我之前是找谁看的来着？")],
         ["明天约了{x}。", "{x}又临时取消了预约。", "周一去见{x}要带什么吗？", "我当初是为什么去找{x}的？"]),
        ("relation",
         [("读书会的{x}明年要移民新西兰", "读书会有个朋友快要出国定居了，好舍不得。"),
          ("读书会的{x}总是选很厚的俄国小说", "读书会里老选那些大部头俄国小说的是谁？"),
          ("在家里办读书会的{x}刚订婚了", "在家里张罗读书会的那位朋友要结婚了！"),
          ("读书会的{x}借给{o}一本签名初版书", "朋友借我的那本签名书还在我这儿。"),
          ("读书会的{x}在机场上夜班", "读书会那个上夜班的朋友总是来不了晚上的活动。")],
         ["{x}问我下次读书会什么时候。", "好久没有{x}的消息了。", "{x}周四会来吗？", "周日要和{x}喝咖啡。"]),
    ],
    "places": [
        ("preference", "cafe",
         [("喜欢在车站旁边的「山丘」咖啡馆看书", "明天上午想去山丘坐坐。"),
          ("常和朋友约在公园边上的「漫时光」", "听说漫时光出了款新蛋糕。"),
          ("下班路上会在「小鹿」买杯咖啡", "小鹿今天又把我的单做错了。"),
          ("周末早上爱去运河边的「青鹭」咖啡馆", "青鹭今天没开门，好失落。")]),
        ("fact", "street",
         [("常在银杏路的花摊买花", "银杏路这周在修路，烦死了。"),
          ("在五道营胡同的小店剪头发", "五道营胡同昨晚好像着火了！"),
          ("最喜欢福州路上的一家旧书店", "福州路那边要盖新楼了。"),
          ("去菜市场要穿过桃源里", "今天下雪，桃源里好美。")]),
        ("fact", "town",
         [("在江西婺源的一个小镇长大", "婺源今天上新闻了！"),
          ("小时候每年暑假都在霞浦的海边过", "同事刚从霞浦玩回来。"),
          ("爷爷奶奶的老家在山西平遥", "我翻到一张平遥的老明信片。"),
          ("每年夏天都回浙江松阳住一阵", "松阳上了最美小城的榜单！")]),
        ("preference", "shopping",
         [("写手帐只用无印良品的本子", "无印良品在打折，要不要囤点？"),
          ("整个夏天都穿勃肯拖鞋", "我的勃肯终于穿坏了。"),
          ("做饭几乎全靠一口酷彩铸铁锅", "把酷彩的锅磕掉了一块漆，心疼死了。"),
          ("看书都用一台旧Kindle", "我的Kindle充不进电了。")]),
    ],
    "rare": [
        ("preference", "craft",
         [("迷上了金缮，用金漆修补摔碎的碗", "我的第一件金缮作品终于完成了！", "我把摔碎的杯子用那种金色的漆粘好了，好好看。"),
          ("在学掐丝珐琅，周末做小摆件", "掐丝珐琅的胶用完了，去哪买？", None),
          ("最近在玩烙画，用电烙笔在木头上画画", "烙画笔做到一半坏了。", "想给朋友做个木头牌子，用我那个在木头上烫图案的手艺。"),
          ("学了绳编，给绿植编挂篮", "绳编的棉绳不够了，得再买点。", None),
          ("在学篆刻，自己刻印章", "篆刻刀钝了，怎么磨？", "想亲手给好朋友刻一枚名章。")],
         ["上过一次陶艺体验课", "冬天喜欢织围巾", "偶尔画画水彩", "周末常拼拼图", "喜欢自己缝靠垫套"]),
        ("preference", "instrument",
         [("在一个民乐团里弹中阮", "我的中阮该换弦了。", None),
          ("在学古琴，每周上一次课", "古琴断了一根弦。", None),
          ("在探戈乐队里拉班多钮手风琴", "班多钮的风箱漏气了。", "我那个探戈乐队下个月有演出，好紧张。"),
          ("在学特雷门琴，就是不用碰就能演奏的那种", "特雷门琴一开冰箱就有杂音。", "我那个挥挥手就能出声的乐器又有杂音了。"),
          ("睡前喜欢弹一会儿拇指琴", "教我用拇指琴弹首新曲子吧。", None),
          ("在学吹葫芦丝", "葫芦丝吹高音总破音。", None)],
         ["小学时吹过竖笛", "一直想学吉他", "洗澡时喜欢唱歌", "小时候学过几年钢琴", "家里有架电子琴在吃灰"]),
        ("fact", "medicine",
         [("每天早上吃优甲乐治甲减", "今天早上忘了吃优甲乐，要紧吗？", "老是忘记吃治甲状腺的药。"),
          ("有哮喘，随身带沙丁胺醇喷雾", "沙丁胺醇快用完了。", "胸口发紧，我的哮喘喷雾放哪了？"),
          ("胃酸反流，在吃奥美拉唑", "奥美拉唑能和咖啡一起吃吗？", "昨晚又烧心，一夜没睡好。"),
          ("偏头痛一发作就吃舒马普坦", "舒马普坦一天能吃两次吗？", None),
          ("血糖偏高，在吃二甲双胍", "二甲双胍饭前吃还是饭后吃？", None)],
         ["冬天会补充维生素D", "偶尔头疼吃片布洛芬", "睡前喝洋甘菊茶助眠", "每天晚上吃一粒镁片", "花粉季会备点抗过敏药"]),
    ],
    "bus": {
        "memory": "坐{x}路公交去{d}",
        "lines": ["7", "12", "19", "23", "38", "47", "55", "61", "73", "88", "104", "305"],
        "dests": [("外婆家", "去外婆家坐几路车来着？"), ("周六的农贸市场", "去农贸市场坐哪路车？"),
                  ("市图书馆", "去图书馆要坐几路？"), ("游泳馆", "去游泳馆是坐哪路来着？"), ("机场", "去机场坐几路公交来着？")],
        "queries": ["{x}路今天早上又晚点了。", "{x}路周日还开吗？", "{x}路一般几点来？", "差十秒没赶上{x}路，气死了。"],
        "avoid": ["地铁"],
    },
    "sizes": [
        ("鞋码是{x}", ["36", "37", "38", "39", "41", "42", "44"], "我的鞋码是多少？网上买靴子要填。", "{x}码的运动鞋我穿合适吗？"),
        ("牛仔裤穿{x}码", ["26", "27", "28", "29", "30"], "牛仔裤我该买多大码？", None),
        ("戒指圈号是{x}号", ["11", "12", "14", "16"], "我要去改戒指，我的圈号是多少来着？", None),
        ("近视{x}度", ["250", "300", "450", "600"], "我近视多少度来着？配眼镜要填。", None),
        ("身高{x}厘米", ["158", "163", "172", "180"], "我说过我多高来着？", None),
    ],
    "dates": [
        ("{when}拿到了驾照", ["year", "year_rel", "month"], "我是什么时候拿的驾照？"),
        ("{when}终于学会了游泳", ["year", "year_rel", "month_rel"], "我是什么时候学会游泳的？"),
        ("{when}滑雪摔断了手腕", ["year", "month", "year_rel"], "我手腕是什么时候摔断的？"),
        ("{when}大学毕业", ["year"], "我是哪年毕业的？"),
        ("{when}去了人生第一个音乐节", ["year", "month"], "我第一次去音乐节是什么时候？"),
        ("{when}开始在社区食堂做志愿者", ["month", "month_rel", "week_rel"], "我什么时候开始去社区食堂帮忙的？"),
        ("{when}拔了智齿", ["week_rel", "day", "month_rel"], "我是什么时候拔的智齿？"),
        ("{when}在表哥的婚礼上唱了歌", ["day", "month", "year_rel"], "我什么时候在表哥婚礼上唱的歌？"),
        ("{when}纹了一只小燕子", ["year", "month_rel", "day"], "我的纹身是什么时候纹的？"),
        ("{when}第一次跳伞", ["day", "year"], "我是什么时候去跳伞的？"),
    ],
    "when": {"year": "{Y}年", "year_rel": ("去年", "前年"), "month": "{Y}年{M}月", "month_rel": "上个月",
             "week_rel": "上周", "day": "{M}月{D}日"},
    "date_q": {"year": ["{Y}年我都干了些什么？", "{Y}年发生过什么事来着？", "还记得我{Y}年做过什么吗？"],
               "month": ["{Y}年{M}月我干了什么来着？", "{Y}年{M}月发生了什么？"],
               "day": ["{M}月{D}日那天我做了什么？", "{M}月{D}日发生了什么来着？"]},
    "months": [],
    "relative": {"上周": "week", "上个月": "month", "去年": "year"},
    "traps": [
        ("我的苹果电脑开不了机了，明天还要交稿。", ("那台MacBook用了七年，老是死机", "fact"),
         ("每个周日都会烤一个苹果派", "preference"), [], "computer"),
        ("医生让我多喝小米粥养胃，怎么煮好喝？", ("胃一直不太好，吃东西得很小心", "fact"),
         ("刚买了一台小米的扫地机器人", "event"), [], "stomach"),
        ("明天要去打针，有点怕。", ("一见针头就腿软，每次接种疫苗都得有人陪着", "fact"), ("周末常和同事去打篮球", "event"), [],
         "illness"),
        ("下个月想去凤凰玩几天。", ("一直盼着去湘西看吊脚楼和沱江", "preference"), ("小时候骑的是一辆凤凰牌自行车", "fact"),
         [], "travel"),
        ("菜鸟驿站的快递怎么还没到？", ("网购的包裹总是放在小区门口的代收点", "fact"), ("打游戏还是个菜鸟，总被队友嫌弃", "fact"),
         [], "parcels"),
        ("这个月花了好多钱，有点慌。", ("最近在记账，发现开销一直超支", "emotion"), ("阳台上种了很多花", "preference"),
         ["攒钱", "存钱"], "money"),
        ("国庆想去黄山看日出。", ("一直盼着去安徽看云海和迎客松", "preference"), ("爷爷以前只抽黄山牌香烟", "relation"), [],
         "travel"),
        ("这件大衣简直是白菜价！", ("很爱淘便宜货，看到打折就忍不住下单", "preference"), ("冬天喜欢囤白菜腌酸菜", "preference"),
         [], "shopping"),
        ("土豆丝怎么炒才脆？", ("最近在学做家常菜", "event"), ("小时候天天在土豆网上看动画", "fact"), [], "cooking"),
        ("感冒一个星期了还没好。", ("一到冬天就容易生病，流行什么就中招", "fact"), ("对网红店一点都不感冒", "preference"), [],
         "illness"),
        ("想买个新包，预算两千左右。", ("看中了一款皮质托特，一直舍不得买", "preference"), ("早餐最爱去楼下那家新包子铺", "preference"),
         [], "shopping"),
        ("山上的杜鹃开了，周末想去看看。", ("春天最喜欢去郊外看漫山的映山红", "preference"),
         ("清晨总被窗外的杜鹃鸟叫醒", "fact"), [], "garden"),
        ("周末想去爬长城。", ("一直盼着去北京郊外的慕田峪走走", "preference"), ("家里开的是一辆长城的SUV", "fact"), ["开车"],
         "travel"),
    ],
}
LEX = {"en": LEX_EN, "zh": LEX_ZH}


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

    # What the lexical part of recall is for (issue 14): a third random stream per user, appended after every
    # earlier row and query.
    extra_memories: list[dict] = []
    extra_queries: list[dict] = []
    for lang in ("en", "zh"):
        for n in range(12):
            uid = f"{lang}{n:02d}"
            existing = [m for m in memories if m["user_id"] == uid]
            mems3, queries3 = lexical(lang, n, uid, ANCHOR + timedelta(days=n * 3, hours=n), existing,
                                      sum(q["user_id"] == uid for q in queries))
            extra_memories += mems3
            extra_queries += queries3
    return memories + extra_memories, queries + extra_queries


def _period(precision: str, start: date) -> str:
    """The ``occurred_at`` string of a period that starts on ``start``: 2019, 2026-03, 2026-W11, 2026-03-14."""
    if precision == "year":
        return f"{start.year}"
    if precision == "month":
        return f"{start.year}-{start.month:02d}"
    if precision == "week":
        iso = start.isocalendar()
        return f"{iso.year}-W{iso.week:02d}"
    return start.isoformat()


def _month_start(d: date) -> date:
    return d.replace(day=1)


def _start(occurred_at: str) -> date:
    """The first day of an ``occurred_at`` period."""
    if "-W" in occurred_at:
        year, week = occurred_at.split("-W")
        return date.fromisocalendar(int(year), int(week), 1)
    year, month, day = (occurred_at.split("-") + ["1", "1"])[:3]
    return date(int(year), int(month), int(day))


def _zh_clean(text: str) -> str:
    """A Latin word inside Chinese text gets a space either side, except next to punctuation."""
    text = re.sub(r" +([，。？！、：；」])", r"\1", text.strip())
    return re.sub(r"「 +", "「", re.sub(r" {2,}", " ", text))


def lexical(lang: str, n: int, uid: str, at: datetime, existing: list[dict], first_query: int
            ) -> tuple[list[dict], list[dict]]:
    """Issue 14: one user's rows and queries where only a name, a rare word, a number or a date tells the
    relevant memory from its look-alikes, plus lexical traps; drawn from a third random stream so every
    earlier row and query keeps its text, dates and ids."""
    L = LEX[lang]
    rng = random.Random(f"lexical-{uid}")
    obj, poss = OBJECT[lang][n % 2], POSSESSIVE[lang][n % 2]
    mems: list[dict] = []
    queries: list[dict] = []
    topics: set[str] = set()

    def allowed(avoid) -> bool:
        return not any(word in m["content"] for word in avoid for m in existing)

    def fmt(template: str, **kw) -> str:
        text = template.format(o=obj, p=poss, **kw)
        return _zh_clean(text) if lang == "zh" else text

    def mem(key: str, content: str, category: str, importance: tuple[float, float], age_days: float,
            occurred: tuple[str, str] | None = None) -> str:
        created = at - timedelta(days=age_days)
        m = {"id": f"{uid}-{key}", "user_id": uid, "content": content, "category": category,
             "importance": None if rng.random() < 0.1 else round(rng.uniform(*importance), 2),
             "created_at": created.isoformat(), "layer": "profile"}
        if occurred is None:  # a relative time in the text resolves against the session's date
            for phrase, precision in L["relative"].items():
                if phrase in content:
                    d = created.date()
                    start = {"week": d - timedelta(days=7 + d.weekday()),
                             "month": _month_start(_month_start(d) - timedelta(days=1)),
                             "year": date(d.year - 1, 1, 1)}[precision]
                    occurred = (_period(precision, start), precision)
                    break
        if occurred:
            m["occurred_at"], m["occurred_precision"] = occurred
        mems.append(m)
        return m["id"]

    def query(text: str, relevant: list[str], tags: list[str], lookalikes: list[str]) -> None:
        queries.append({"id": f"{uid}-q{first_query + len(queries):02d}", "user_id": uid, "text": text,
                        "at": at.isoformat(), "relevant_ids": relevant, "superseded_ids": [],
                        "tags": [lang, "lexical", *tags],
                        "lookalike_ids": [i for i in lookalikes if i not in relevant]})

    def age() -> float:
        return rng.uniform(3, 400)

    # Proper nouns: four people in one role (only the name tells them apart), three places of one kind.
    category, facts, name_qs = rng.choice(L["roles"])
    names = rng.sample(L["people"], 4)
    facts = rng.sample(facts, 4)

    def x(name: str) -> str:  # a Latin name in Chinese text is spaced
        return f" {name} " if lang == "zh" and name.isascii() else name

    people = [mem(f"name-person{i}", fmt(fact, x=x(name)), category, (0.3, 0.7), age())
              for i, (name, (fact, _)) in enumerate(zip(names, facts))]
    query(fmt(rng.choice(name_qs), x=x(names[0])), [people[0]], ["name", "person"], people)
    person_paraphrase = (facts[1][1], people[1])
    category, topic, places = rng.choice(L["places"])
    topics.add(topic)
    places = rng.sample(places, 3)
    place_ids = [mem(f"name-place{i}", fmt(text), category, (0.3, 0.7), age()) for i, (text, _) in enumerate(places)]
    query(places[0][1], [place_ids[0]], ["name", "place"], place_ids)

    # Rare words: two rare hobbies, instruments or medicines and two ordinary ones like them.
    category, topic, items, ordinary = rng.choice([g for g in L["rare"] if g[1] not in topics])
    topics.add(topic)
    items = rng.sample(items, 2)
    importance = (0.5, 0.9) if topic == "medicine" else (0.3, 0.7)
    rare = [mem(f"rare{i}", fmt(text), category, importance, age()) for i, (text, _, _) in enumerate(items)]
    rare += [mem(f"rare{i + 2}", fmt(text), category, importance, age())
             for i, text in enumerate(rng.sample(ordinary, 2))]
    for i in range(rng.choice([1, 2])):
        query(fmt(items[i][1]), [rare[i]], ["rare", topic], rare)
    rare_paraphrases = [(items[i][2], rare[i]) for i in (1, 0) if items[i][2]]
    # One query about a look-alike group with none of its distinguishing words: lexical evidence must not hurt.
    if rare_paraphrases and rng.random() < 0.5:
        text, target = rare_paraphrases[0]
        query(fmt(text), [target], ["paraphrase", topic], rare)
    else:
        query(person_paraphrase[0], [person_paraphrase[1]], ["paraphrase", "person"], people)

    # Numbers: four bus lines, or four sizes and measurements.
    bus = L["bus"]
    if allowed(bus["avoid"]) and rng.random() < 0.6:
        lines = rng.sample(bus["lines"], 4)
        dests = rng.sample(bus["dests"], 4)
        ids = [mem(f"number{i}", fmt(bus["memory"], x=line, d=fmt(dest)), "fact", (0.3, 0.6), age())
               for i, (line, (dest, _)) in enumerate(zip(lines, dests))]
        query(fmt(rng.choice(bus["queries"]), x=lines[0]), [ids[0]], ["number", "bus"], ids)
        query(dests[1][1], [ids[1]], ["number", "bus"], ids)
    else:
        sizes = [L["sizes"][0], *rng.sample(L["sizes"][1:], 3)]
        values = [rng.choice(values) for _, values, _, _ in sizes]
        ids = [mem(f"number{i}", fmt(text, x=value), "fact", (0.3, 0.6), age())
               for i, ((text, _, _, _), value) in enumerate(zip(sizes, values))]
        shoe_ask, shoe_token = sizes[0][2], sizes[0][3]
        query(fmt(shoe_token, x=values[0]) if rng.random() < 0.5 else shoe_ask, [ids[0]], ["number", "size"], ids)
        other = rng.randrange(1, 4)
        query(sizes[other][2], [ids[other]], ["number", "size"], ids)

    # Dates: four events of one kind with their event time (occurred_at), in four different years. Explicit
    # years and months are 2008-2021, before anything else the user said happened; "last year", "last month",
    # "last week" and a day ("on 14 March") are recent, resolved against when the memory was written. A bare
    # year says no time at all in the text: the year is in occurred_at only (extraction took it out).
    when, months = L["when"], L["months"]
    events = rng.sample(L["dates"], 4)
    drawn: list[tuple[float, str, date, str, dict]] = []
    for e, (template, kinds, _) in enumerate(events):
        kinds = [*kinds, "year_bare"]
        if e == 0:  # the one asked by its period: a year, a month or a day
            kinds = [k for k in kinds if k in ("year", "year_bare", "month", "day")]
        for _attempt in range(100):
            age_days = age()
            d = (at - timedelta(days=age_days)).date()
            kind = rng.choice(kinds)
            if kind in ("year", "year_bare"):
                start, precision, said = date(rng.randint(2008, 2021), 1, 1), "year", when.get(kind, "")
            elif kind == "year_rel":
                back = rng.randrange(2)
                start, precision, said = date(d.year - 1 - back, 1, 1), "year", when["year_rel"][back]
            elif kind == "month":
                start, precision, said = date(rng.randint(2012, 2021), rng.randint(1, 12), 1), "month", when["month"]
            elif kind == "month_rel":
                start, precision, said = _month_start(_month_start(d) - timedelta(days=1)), "month", when["month_rel"]
            elif kind == "week_rel":
                start, precision, said = d - timedelta(days=7 + d.weekday()), "week", when["week_rel"]
            else:
                start, precision, said = d - timedelta(days=rng.randint(1, 120)), "day", when["day"]
            if start.year not in {s.year for _, _, s, _, _ in drawn}:
                break
        else:
            raise SystemExit(f"{uid}: no distinct years for the date events")
        parts = {"Y": start.year, "M": start.month, "D": start.day, "Mon": months[start.month - 1] if months else ""}
        drawn.append((age_days, precision, start, fmt(template, when=said.format(**parts)).strip(), parts))
    date_ids = [mem(f"date{i}", text, "event", (0.3, 0.7), age_days, (_period(precision, start), precision))
                for i, (age_days, precision, start, text, _) in enumerate(drawn)]
    # The first asked by its period ("what happened in 2019?", settled below once every row exists), the
    # second asked when.
    _, precision, start, _, parts = drawn[0]
    by_period = {"text": fmt(rng.choice(L["date_q"][precision]), **parts), "period": (precision, start)}
    queries.append(by_period)
    query(events[1][2], [date_ids[1]], ["date", "when"], date_ids)

    # Lexical traps: the query shares a word with a memory that means something else. Taken in turn (the twelve
    # users start at evenly spaced places in the list), so that every trap is used about as often.
    traps = L["traps"]
    start = n * len(traps) // 12
    picked: list[tuple] = []
    for trap in (traps[(start + i) % len(traps)] for i in range(len(traps))):
        if not allowed(trap[3]):
            continue
        if len(picked) < 3 and trap[4] not in topics:
            picked.append(trap)
            topics.add(trap[4])
    for i, (text, (good, good_category), (bad, bad_category), _, _) in enumerate(picked):
        good_id = mem(f"lextrap{i}-relevant", fmt(good), good_category, (0.3, 0.7), age())
        bad_id = mem(f"lextrap{i}-trap", fmt(bad), bad_category, (0.3, 0.7), age())
        query(text, [good_id], ["lexical_trap"], [bad_id])

    # The date asked by its period: every row whose event time lies inside it is relevant; none may only
    # overlap it (a week around the asked day), and no earlier row may have been written on the asked day.
    precision, start = by_period.pop("period")
    end = {"year": date(start.year + 1, 1, 1), "month": _month_start(start + timedelta(days=31)),
           "day": start + timedelta(days=1)}[precision]
    inside = []
    for m in mems:
        if "occurred_at" in m:
            s0 = _start(m["occurred_at"])
            s1 = {"year": date(s0.year + 1, 1, 1), "month": _month_start(s0 + timedelta(days=31)),
                  "week": s0 + timedelta(days=7), "day": s0 + timedelta(days=1)}[m["occurred_precision"]]
            if start <= s0 and s1 <= end:
                inside.append(m["id"])
            elif s0 < end and start < s1:
                raise SystemExit(f"{uid}: {m['id']} overlaps the asked period {start}..{end}")
    if precision == "day" and any(datetime.fromisoformat(m["created_at"]).date() == start for m in existing):
        raise SystemExit(f"{uid}: an earlier row was written on the asked day {start}")
    by_period.update({"id": f"{uid}-q{first_query + queries.index(by_period):02d}", "user_id": uid,
                      "text": by_period.pop("text"), "at": at.isoformat(), "relevant_ids": inside,
                      "superseded_ids": [], "tags": [lang, "lexical", "date", precision],
                      "lookalike_ids": [i for i in date_ids if i not in inside]})
    return mems, queries


def main() -> None:
    memories, queries = build()
    OUT.mkdir(parents=True, exist_ok=True)
    for name, field, rows in (("memories", "content", memories), ("queries", "text", queries)):
        path = OUT / f"{name}.jsonl"
        # Keep the embedding of every row whose text is unchanged: bench/embed_recall_dev.py then embeds only
        # the new rows, and every earlier result stays where it was (the model's output depends slightly on
        # the batch it runs in).
        known = {}
        if path.exists():
            known = {r["id"]: r for r in (json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
                                          if line.strip())}
        kept = 0
        with open(path, "w", encoding="utf-8") as f:
            for row in rows:
                old = known.get(row["id"])
                if old is not None and old[field] == row[field] and "embedding" in old:
                    row["embedding"] = old["embedding"]
                    if "embedding_model" in old:
                        row["embedding_model"] = old["embedding_model"]
                    kept += 1
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"{name}: {len(rows)} rows, {kept} kept their embedding, {len(rows) - kept} need one -> {path}")


if __name__ == "__main__":
    main()
