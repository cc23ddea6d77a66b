// Each family's rendering of the same chat, recognised from a template source by its markers.
// The ChatML case uses testdata/qwen_dir's template, whose output for [{user: hi}] with
// add_generation_prompt was recorded from transformers 5.24's apply_chat_template; the GLM and
// DeepSeek strings follow the chat templates shipped in those models' tokenizer_config.json.
#include "trainer/data/chat_template.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "launch/check.h"
#include "launch/json.h"
#include "tests/runfiles.h"

namespace rl::data {
namespace {

const std::vector<ChatMessage> kChat = {{"system", "Be brief."}, {"user", "What is 2+2?"}};

}  // namespace

TEST_CASE("the Qwen-style template of testdata/qwen_dir renders as transformers does",
          "[chat_template]") {
  const std::string root = rl::testing::RunfilePath("");
  const json::Value config =
      json::ParseFile(root + "trainer/data/testdata/qwen_dir/tokenizer_config.json");
  const ChatTemplate t = ChatTemplate::Recognize(config.at("chat_template").AsString());
  CHECK(t.Apply({{"user", "hi"}}) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

TEST_CASE("ChatML (Qwen) rendering, with and without thinking", "[chat_template]") {
  const ChatTemplate t = ChatTemplate::Recognize(
      "{%- for message in messages %}{{- '<|im_start|>' + message.role }}{% endfor %}"
      "{%- if enable_thinking is defined and enable_thinking is false %}{% endif %}");
  REQUIRE(t.format() == ChatFormat::kChatMl);
  CHECK(t.Apply(kChat) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n");
  CHECK(t.Apply({{"user", "hi"}}, {AddGenerationPrompt::kYes, Thinking::kOff}) ==
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  CHECK(t.Apply({{"user", "hi"}}, {AddGenerationPrompt::kNo, Thinking::kDefault}) ==
        "<|im_start|>user\nhi<|im_end|>\n");
}

TEST_CASE("Qwen2.5's default system prompt is added when the chat has none", "[chat_template]") {
  const ChatTemplate t = ChatTemplate::Recognize(
      "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
      "assistant.<|im_end|>\\n' }}");
  CHECK(t.Apply({{"user", "hi"}}) ==
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  CHECK(t.Apply(kChat).rfind("<|im_start|>system\nBe brief.", 0) == 0);
}

TEST_CASE("GLM-4.5 rendering: newline after role tokens", "[chat_template]") {
  const ChatTemplate t = ChatTemplate::Recognize("[gMASK]<sop>{%- for m in messages -%}");
  REQUIRE(t.format() == ChatFormat::kGlm45);
  CHECK(t.Apply(kChat) == "[gMASK]<sop><|system|>\nBe brief.<|user|>\nWhat is 2+2?<|assistant|>");
  CHECK(t.Apply({{"user", "x"}}, {AddGenerationPrompt::kYes, Thinking::kOff}) ==
        "[gMASK]<sop><|user|>\nx<|assistant|>\n<think></think>");
}

TEST_CASE("GLM-4.7/GLM-5 rendering: no newline, <think> or </think>", "[chat_template]") {
  const ChatTemplate t =
      ChatTemplate::Recognize("[gMASK]<sop>{%- if clear_thinking is defined -%}{%- endif -%}");
  REQUIRE(t.format() == ChatFormat::kGlm47);
  CHECK(t.Apply(kChat) ==
        "[gMASK]<sop><|system|>Be brief.<|user|>What is 2+2?<|assistant|><think>");
  CHECK(t.Apply(kChat, {AddGenerationPrompt::kYes, Thinking::kOff}) ==
        "[gMASK]<sop><|system|>Be brief.<|user|>What is 2+2?<|assistant|></think>");
}

TEST_CASE("DeepSeek-V3 rendering", "[chat_template]") {
  const ChatTemplate t = ChatTemplate::Recognize(
      "{{ bos_token }}{% for m in messages %}{{'<｜User｜>' + m['content']}}{% endfor %}");
  REQUIRE(t.format() == ChatFormat::kDeepSeekV3);
  CHECK(t.Apply(kChat) == "<｜begin▁of▁sentence｜>Be brief.<｜User｜>What is 2+2?<｜Assistant｜>");
  CHECK(t.Apply({{"user", "a"}, {"assistant", "b"}, {"user", "c"}}) ==
        "<｜begin▁of▁sentence｜><｜User｜>a<｜Assistant｜>b<｜end▁of▁sentence｜><｜User｜>c"
        "<｜Assistant｜>");
}

TEST_CASE("unknown templates, Kimi and bad chats fail clearly", "[chat_template]") {
  CHECK_THROWS_WITH(
      ChatTemplate::Recognize("{{ messages[0].content }}"),
      Catch::Contains("chat template not recognised") && Catch::Contains("<|im_start|>"));
  CHECK_THROWS_AS(ChatTemplate::Recognize("<|im_user|>user<|im_middle|>"), CheckpointError);
  const ChatTemplate t(ChatFormat::kChatMl);
  CHECK_THROWS_WITH(t.Apply({}), Catch::Contains("empty chat"));
  CHECK_THROWS_WITH(t.Apply({{"tool", "x"}}), Catch::Contains("role \"tool\""));
  CHECK(ParseChatFormat("glm47") == ChatFormat::kGlm47);
  CHECK_THROWS_AS(ParseChatFormat("jinja"), ConfigError);
}

}  // namespace rl::data
