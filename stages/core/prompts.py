"""Prompt formats, written once: the zero-shot prompt of SFT and RL models in one of two styles, the RL templates,
and few-shot formats for base / pretrained models.

Zero-shot prompt (:class:`PromptFormat`, one per model: SFT, GRPO, the reward model and evaluation build every
prompt through the format of the tokenizer they load, so a question's prompt tokens are the same in every stage):

- ``deepseekmath`` (default; DeepSeekMath's evaluation: deepseek-ai/DeepSeek-Math, evaluation/run_subset_parallel.py,
  ``markup_question``; SFT uses the same): ``User: {question}\\n{instruction}\\n\\nAssistant:`` followed directly by
  the response (`` {solution}``);
- ``chat_template``: the tokenizer's own chat template (``apply_chat_template``) on one user message
  ``{question}\\n{instruction}``, with the generation prompt; the response is the solution as is. A template that
  writes the BOS token itself gets it removed from the text when the tokenizer adds BOS on its own, so the token
  ids of ``tokenizer(prompt)`` (how every stage tokenises prompts) hold one BOS, as ``apply_chat_template``'s own.

The style is a param (``base_model.prompt_format``) recorded with the model: the base_model stage writes it into
the tokenizer's config (``tokenizer_config.json``, key ``pipeline_prompt_format``; ``model_ref.json`` for a
checkpoint used in place), every later stage saves the tokenizer it loaded, so the format travels with the model.
A model without the key uses ``deepseekmath``. The training target of a response is ``response(solution)``
followed by the tokenizer's EOS token (for a chat model this is its end-of-turn token, e.g. Qwen's ``<|im_end|>``).

RL templates (``grpo.template``, :func:`rl_prompt`): ``deepseekmath`` = the model's zero-shot CoT prompt above (in
its recorded style), ``r1`` = DeepSeek-R1-Zero's plain-text template (for RL from a base model).

The CoT and TIR instructions are DeepSeekMath's English ones. The PoT instruction is ours: the paper
trains on PoT data but its evaluation code has no zero-shot PoT instruction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from stages.core.errors import PipelineError

Mode = Literal["cot", "pot", "tir"]
Style = Literal["deepseekmath", "chat_template"]
STYLES: tuple[str, ...] = ("deepseekmath", "chat_template")
STYLE_KEY = "pipeline_prompt_format"
"""Where a model records its prompt style: a key of its tokenizer config (``tokenizer.init_kwargs``)."""

INSTRUCTIONS: dict[str, str] = {
    "cot": "Please reason step by step, and put your final answer within \\boxed{}.",
    "tir": (
        "Please integrate natural language reasoning with programs to solve the problem above, "
        "and put your final answer within \\boxed{}."
    ),
    # Ours (documented in docs/training.md): asks for the PAL convention that the sandbox executes.
    "pot": "Please write a Python function solution() that returns the final answer.",
}


def chat_prompt(question: str, mode: Mode = "cot") -> str:
    """The zero-shot prompt in the ``deepseekmath`` style: ``User: {q}\\n{instruction}\\n\\nAssistant:``."""
    return f"User: {question}\n{INSTRUCTIONS[mode]}\n\nAssistant:"


# ---------------------------------------------------------------------------------------------
# RL prompt templates (``grpo.template``): the DeepSeekMath chat prompt above, or DeepSeek-R1-Zero's template
# (DeepSeek-R1, Guo et al. 2025, Table 1) with two departures: the answer goes in \boxed{} rather than
# <answer> tags (the rule reward and the evaluation read boxed answers; R1 asks for "a specified format (e.g. a
# box)"), and the prompt ends with the opening <think> so that the model continues inside the reasoning block (as
# open R1-Zero reproductions do); the completion is then "reasoning </think> answer".

R1_TEMPLATE = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The assistant "
    "first thinks about the reasoning process in the mind and then provides the user with the answer. The reasoning "
    "process is enclosed within <think> </think> tags and the final answer follows within \\boxed{}, i.e., <think> "
    "reasoning process here </think> The answer is \\boxed{answer here}. User: {question} Assistant: <think>"
)


def r1_prompt(question: str) -> str:
    """DeepSeek-R1-Zero's template around ``question`` (see :data:`R1_TEMPLATE`)."""
    return R1_TEMPLATE.replace("{question}", question.strip())


RL_TEMPLATES = {"deepseekmath": lambda q: chat_prompt(q, "cot"), "r1": r1_prompt}
"""``grpo.template`` -> prompt builder of the RL rollouts and the held-out curve (without a tokenizer)."""


def rl_prompt(question: str, template: str = "deepseekmath", tokenizer: Any = None) -> str:
    """The RL prompt of ``question`` in ``template`` (:data:`RL_TEMPLATES`); ``deepseekmath`` with the model's
    ``tokenizer``: the model's own zero-shot CoT prompt (:func:`prompt_format`: DeepSeekMath's or its chat template),
    the prompt its SFT trained on and its evaluation uses."""
    if template == "deepseekmath" and tokenizer is not None:
        return prompt_format(tokenizer).prompt(question, "cot")
    return RL_TEMPLATES[template](question)


def response_text(solution: str) -> str:
    """The ``deepseekmath`` training/target response: a space, then the solution (EOS added by the tokenizer step)."""
    return " " + solution.strip()


def user_message(question: str, mode: Mode = "cot") -> str:
    """The user turn of both styles: the question, a newline, the instruction of the mode."""
    return f"{question}\n{INSTRUCTIONS[mode]}"


def recorded_style(tokenizer: Any) -> str:
    """The prompt style a model's tokenizer records (``deepseekmath`` when it records none)."""
    style = (getattr(tokenizer, "init_kwargs", None) or {}).get(STYLE_KEY) or "deepseekmath"
    if style not in STYLES:
        raise PipelineError(f"the model's tokenizer records prompt format {style!r}; expected one of {STYLES}")
    return style


def record_style(tokenizer: Any, style: str) -> None:
    """Record ``style`` in the tokenizer (saved with it by ``save_pretrained``); a chat template must exist."""
    if style not in STYLES:
        raise PipelineError(f"prompt format {style!r}; expected one of {STYLES}")
    if style == "chat_template" and not getattr(tokenizer, "chat_template", None):
        raise PipelineError("prompt format chat_template: the tokenizer has no chat template; use deepseekmath")
    tokenizer.init_kwargs[STYLE_KEY] = style


@dataclass(frozen=True)
class PromptFormat:
    """The zero-shot prompt and response text of one model (see the module docstring)."""

    style: str
    tokenizer: Any = None

    def prompt(self, question: str, mode: Mode = "cot") -> str:
        """The prompt text; ``tokenizer(prompt)`` gives its token ids in every stage."""
        if self.style == "deepseekmath":
            return chat_prompt(question, mode)
        tok = self.tokenizer
        text = tok.apply_chat_template([{"role": "user", "content": user_message(question, mode)}], tokenize=False,
                                       add_generation_prompt=True)
        bos = tok.bos_token
        if bos and text.startswith(bos) and adds_bos(tok):
            text = text[len(bos):]
        return text

    def response(self, solution: str) -> str:
        """The response text a solution is trained as (EOS follows it)."""
        return response_text(solution) if self.style == "deepseekmath" else solution.strip()


def adds_bos(tokenizer: Any) -> bool:
    """Whether ``tokenizer(text)`` puts the BOS token in front of the text by itself."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return False
    ids = tokenizer("x", add_special_tokens=True)["input_ids"]
    return bool(ids) and ids[0] == bos and tokenizer("x", add_special_tokens=False)["input_ids"][:1] != [bos]


def prompt_format(tokenizer: Any) -> PromptFormat:
    """The prompt format a model's tokenizer records (:func:`recorded_style`)."""
    style = recorded_style(tokenizer)
    if style == "chat_template" and not getattr(tokenizer, "chat_template", None):
        raise PipelineError("the model records prompt format chat_template but its tokenizer has no chat template; "
                            "use a tokenizer with one (or base_model.prompt_format: deepseekmath)")
    return PromptFormat(style, tokenizer)


# ---------------------------------------------------------------------------------------------
# Few-shot formats for base / pretrained models (DeepSeekMath's evaluation: deepseek-ai/DeepSeek-Math,
# evaluation/few_shot_prompts/cot_gsm_8_shot.py and cot_minerva_math_4_shot.py; added by the evaluation
# stage). Each builder returns the full prompt; the model continues right after it, and generation stops at
# the format's stop string.

GSM8K_8SHOT_EXEMPLARS: tuple[tuple[str, str], ...] = (
    ("There are 15 trees in the grove. Grove workers will plant trees in the grove today. After they are done, "
     "there will be 21 trees. How many trees did the grove workers plant today?",
     "There are 15 trees originally. Then there were 21 trees after some more were planted. "
     "So there must have been 21 - 15 = 6. The answer is 6."),
    ("If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are in the parking lot?",
     "There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5. The answer is 5."),
    ("Leah had 32 chocolates and her sister had 42. If they ate 35, how many pieces do they have left in total?",
     "Originally, Leah had 32 chocolates. Her sister had 42. So in total they had 32 + 42 = 74. "
     "After eating 35, they had 74 - 35 = 39. The answer is 39."),
    ("Jason had 20 lollipops. He gave Denny some lollipops. Now Jason has 12 lollipops. "
     "How many lollipops did Jason give to Denny?",
     "Jason started with 20 lollipops. Then he had 12 after giving some to Denny. "
     "So he gave Denny 20 - 12 = 8. The answer is 8."),
    ("Shawn has five toys. For Christmas, he got two toys each from his mom and dad. How many toys does he have now?",
     "Shawn started with 5 toys. If he got 2 toys each from his mom and dad, then that is 4 more toys. "
     "5 + 4 = 9. The answer is 9."),
    ("There were nine computers in the server room. Five more computers were installed each day, from monday to "
     "thursday. How many computers are now in the server room?",
     "There were originally 9 computers. For each of 4 days, 5 more computers were added. "
     "So 5 * 4 = 20 computers were added. 9 + 20 is 29. The answer is 29."),
    ("Michael had 58 golf balls. On tuesday, he lost 23 golf balls. On wednesday, he lost 2 more. "
     "How many golf balls did he have at the end of wednesday?",
     "Michael started with 58 golf balls. After losing 23 on tuesday, he had 58 - 23 = 35. "
     "After losing 2 more, he had 35 - 2 = 33 golf balls. The answer is 33."),
    ("Olivia has $23. She bought five bagels for $3 each. How much money does she have left?",
     "Olivia had 23 dollars. 5 bagels for 3 dollars each will be 5 x 3 = 15 dollars. "
     "So she has 23 - 15 dollars left. 23 - 15 is 8. The answer is 8."),
)
"""The 8 chain-of-thought exemplars of DeepSeekMath's GSM8K few-shot prompt (Wei et al. 2022)."""

MINERVA_MATH_4SHOT = r"""Problem:
Find the domain of the expression $\frac{\sqrt{x-2}}{\sqrt{5-x}}$.}

Solution:
The expressions inside each square root must be non-negative.
Therefore, $x-2 \ge 0$, so $x\ge2$, and $5 - x \ge 0$, so $x \le 5$.
Also, the denominator cannot be equal to zero, so $5-x>0$, which gives $x<5$.
Therefore, the domain of the expression is $\boxed{[2,5)}$.
Final Answer: The final answer is $[2,5)$. I hope it is correct.

Problem:
If $\det \mathbf{A} = 2$ and $\det \mathbf{B} = 12,$ then find $\det (\mathbf{A} \mathbf{B}).$

Solution:
We have that $\det (\mathbf{A} \mathbf{B}) = (\det \mathbf{A})(\det \mathbf{B}) = (2)(12) = \boxed{24}.$
Final Answer: The final answer is $24$. I hope it is correct.

Problem:
Terrell usually lifts two 20-pound weights 12 times. If he uses two 15-pound weights instead, how many times must Terrell lift them in order to lift the same total weight?

Solution:
If Terrell lifts two 20-pound weights 12 times, he lifts a total of $2\cdot 12\cdot20=480$ pounds of weight.  If he lifts two 15-pound weights instead for $n$ times, he will lift a total of $2\cdot15\cdot n=30n$ pounds of weight.  Equating this to 480 pounds, we can solve for $n$: \begin{align*}
30n&=480\\
\Rightarrow\qquad n&=480/30=\boxed{16}
\end{align*}
Final Answer: The final answer is $16$. I hope it is correct.

Problem:
If the system of equations

\begin{align*}
6x-4y&=a,\\
6y-9x &=b.
\end{align*}has a solution $(x, y)$ where $x$ and $y$ are both nonzero, find $\frac{a}{b},$ assuming $b$ is nonzero.

Solution:
If we multiply the first equation by $-\frac{3}{2}$, we obtain

$$6y-9x=-\frac{3}{2}a.$$Since we also know that $6y-9x=b$, we have

$$-\frac{3}{2}a=b\Rightarrow\frac{a}{b}=\boxed{-\frac{2}{3}}.$$
Final Answer: The final answer is $-\frac{2}{3}$. I hope it is correct."""  # noqa: E501
"""DeepSeekMath's MATH 4-shot prompt (Minerva, Lewkowycz et al. 2022), verbatim including its stray ``}``."""

QA_STOP = "\nQ:"
"""Stop string of the ``Q:``/``A:`` few-shot formats (GSM8K and the generated problems)."""
MINERVA_STOP = "\nProblem:"
"""Stop string of the Minerva MATH format."""
PARAGRAPH_STOP = "\n\n"
"""Second stop string of the generated problems' few-shot format: their exemplar answers are one paragraph, so a
blank line ends an answer. A model pretrained on the generated corpus goes on with the corpus's next problem
(``Problem 3. ...``), which :data:`QA_STOP` never meets: without it every few-shot completion ran to
``max_new_tokens``, three quarters of it past the answer, and no verdict of any checker changed when it was cut.
The real benchmarks keep the paper's stops (GSM8K ``\nQ:``, as lm-evaluation-harness's gsm8k-cot ``Q:``)."""


def qa_fewshot_prompt(question: str, exemplars: Sequence[tuple[str, str]]) -> str:
    """DeepSeekMath's ``Q:``/``A:`` few-shot prompt: exemplars ``Q: {q}\\nA: {a}`` separated by two blank
    lines, then ``Q: {question}\\nA:``. Stop generation at :data:`QA_STOP`."""
    shots = "\n\n\n".join(f"Q: {q.strip()}\nA: {a.strip()}" for q, a in exemplars)
    head = f"{shots}\n\n\n" if shots else ""
    return f"{head}Q: {question.strip()}\nA:"


def gsm8k_fewshot_prompt(question: str) -> str:
    """The GSM8K 8-shot chain-of-thought prompt of DeepSeekMath's base-model evaluation (stop at ``\\nQ:``)."""
    return qa_fewshot_prompt(question, GSM8K_8SHOT_EXEMPLARS)


def minerva_math_prompt(question: str) -> str:
    """The MATH 4-shot Minerva prompt: ``...\\n\\nProblem:\\n{q}\\n\\nSolution:`` (stop at ``\\nProblem:``)."""
    return f"{MINERVA_MATH_4SHOT}\n\nProblem:\n{question.strip()}\n\nSolution:"
