#include "trainer/data/chat_template.h"

#include <fmt/format.h>

#include "launch/check.h"

namespace rl::data {
namespace {

constexpr std::string_view kQwen25DefaultSystem =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

bool Contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

}  // namespace

std::string_view ChatFormatName(ChatFormat format) {
  switch (format) {
    case ChatFormat::kChatMl:
      return "chatml";
    case ChatFormat::kGlm45:
      return "glm45";
    case ChatFormat::kGlm47:
      return "glm47";
    case ChatFormat::kDeepSeekV3:
      return "deepseek_v3";
  }
  return "?";
}

ChatFormat ParseChatFormat(std::string_view name) {
  for (ChatFormat f :
       {ChatFormat::kChatMl, ChatFormat::kGlm45, ChatFormat::kGlm47, ChatFormat::kDeepSeekV3}) {
    if (ChatFormatName(f) == name) return f;
  }
  throw ConfigError(fmt::format(
      "unknown chat format \"{}\" (expected chatml, glm45, glm47 or deepseek_v3)", name));
}

ChatTemplate ChatTemplate::Recognize(std::string_view source) {
  if (Contains(source, "<|im_start|>")) {
    ChatTemplate t(ChatFormat::kChatMl);
    if (Contains(source, kQwen25DefaultSystem))
      t.default_system_ = std::string(kQwen25DefaultSystem);
    t.mentions_thinking_ = Contains(source, "enable_thinking");
    return t;
  }
  if (Contains(source, "[gMASK]")) {
    return ChatTemplate(Contains(source, "clear_thinking") ? ChatFormat::kGlm47
                                                           : ChatFormat::kGlm45);
  }
  if (Contains(source, "<｜User｜>")) return ChatTemplate(ChatFormat::kDeepSeekV3);
  if (Contains(source, "<|im_user|>")) {
    throw CheckpointError(
        "chat template: Kimi's template (<|im_user|>) is not supported; pre-format the prompts "
        "or disable the chat template");
  }
  throw CheckpointError(fmt::format(
      "chat template not recognised: it contains none of the markers <|im_start|> (ChatML, "
      "Qwen), [gMASK] (GLM), <｜User｜> (DeepSeek-V3); pre-format the prompts or disable the chat "
      "template (template starts with: \"{}\")",
      source.substr(0, 80)));
}

std::string ChatTemplate::Apply(const std::vector<ChatMessage>& messages,
                                const ChatTemplateOptions& options) const {
  RL_CHECK(!messages.empty(), CheckpointError, "chat template {}: empty chat",
           ChatFormatName(format_));
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    RL_CHECK(role == "system" || role == "user" || role == "assistant", CheckpointError,
             "chat template {}: message {} has role \"{}\" (supported: system, user, assistant)",
             ChatFormatName(format_), i, role);
  }
  const bool generate = options.add_generation_prompt == AddGenerationPrompt::kYes;
  const bool thinking_off = options.thinking == Thinking::kOff;
  std::string out;
  switch (format_) {
    case ChatFormat::kChatMl: {
      if (!default_system_.empty() && messages.front().role != "system") {
        out += fmt::format("<|im_start|>system\n{}<|im_end|>\n", default_system_);
      }
      for (const ChatMessage& m : messages) {
        out += fmt::format("<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content);
      }
      if (generate) {
        out += "<|im_start|>assistant\n";
        if (thinking_off && mentions_thinking_) out += "<think>\n\n</think>\n\n";
      }
      break;
    }
    case ChatFormat::kGlm45:
    case ChatFormat::kGlm47: {
      const char* newline = format_ == ChatFormat::kGlm45 ? "\n" : "";
      out += "[gMASK]<sop>";
      for (const ChatMessage& m : messages) {
        out += fmt::format("<|{}|>{}{}", m.role, newline, m.content);
      }
      if (generate) {
        out += "<|assistant|>";
        if (format_ == ChatFormat::kGlm45) {
          if (thinking_off) out += "\n<think></think>";
        } else {
          out += thinking_off ? "</think>" : "<think>";
        }
      }
      break;
    }
    case ChatFormat::kDeepSeekV3: {
      out += "<｜begin▁of▁sentence｜>";
      size_t first = 0;
      if (messages.front().role == "system") {
        out += messages.front().content;
        first = 1;
      }
      for (size_t i = first; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        RL_CHECK(m.role != "system", CheckpointError,
                 "chat template deepseek_v3: message {} is a system message after the first", i);
        if (m.role == "user") {
          out += "<｜User｜>" + m.content;
        } else {
          out += "<｜Assistant｜>" + m.content + "<｜end▁of▁sentence｜>";
        }
      }
      if (generate) out += "<｜Assistant｜>";
      break;
    }
  }
  return out;
}

}  // namespace rl::data
