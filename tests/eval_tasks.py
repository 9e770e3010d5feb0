"""The two local lm-eval tasks the tests write (tests/test_eval.py, and tests/test_cuda.py's tasks during training):
their examples, their YAML, and write_task. Plain data and files, no lm-eval: a GPU machine without lm-eval still
imports this (test_cuda.py's task test then skips)."""

import json
import os

# invented examples, none from a real data set; the third context is longer than BLOCK tokens
MULTIPLE_CHOICE = [
    {"query": "The baker opened the oven and took out", "choices": ["a loaf of bread.", "a violin.", "the moon."],
     "label": 0},
    {"query": "When the river froze, the children went", "choices": ["skating.", "swimming."], "label": 0},
    {"query": "After three weeks at sea, with the water barrels nearly empty and the crew restless, the captain "
              "finally saw", "choices": ["land on the horizon.", "a bicycle shop.", "his own reflection.",
                                         "nothing at all."], "label": 0},
    {"query": "She planted the seeds in spring and in autumn she", "choices": ["harvested pumpkins.",
                                                                              "sold the tractor."], "label": 0},
    {"query": "The library was quiet except for", "choices": ["the turning of pages.", "a marching band."],
     "label": 1},
]
TEXTS = [
    {"text": "A short line."},
    {"text": "The lighthouse keeper counted the gulls every morning, wrote their number in a blue ledger, and never "
             "once told anyone in the village why the ledger mattered so much to him or to his father before him."},
]
MC_YAML = """task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    validation: {path}
output_type: multiple_choice
validation_split: validation
doc_to_text: "{{{{query}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - {{metric: acc, aggregation: mean, higher_is_better: true}}
  - {{metric: acc_norm, aggregation: mean, higher_is_better: true}}
"""
TEXT_YAML = """task: tiny_text
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
output_type: loglikelihood_rolling
test_split: test
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - {{metric: word_perplexity, aggregation: weighted_perplexity, higher_is_better: false}}
"""


def write_task(directory, name, yaml_template, rows, data_path=None):
    """Write rows as <name>.jsonl and the task's YAML (pointing at data_path, default that file) into directory."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{name}.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    with open(os.path.join(directory, f"{name}.yaml"), "w") as f:
        f.write(yaml_template.format(path=data_path or path))
