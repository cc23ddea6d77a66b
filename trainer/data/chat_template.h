// Chat templates of the supported model families, without a Jinja engine.
//
// A checkpoint ships its chat template as Jinja source (tokenizer_config.json's chat_template or
// chat_template.jinja). Running Jinja is out of scope, so ChatTemplate::Recognize() looks for the
// family's markers in that source and renders the family's format in C++:
//
//   kChatMl    (Qwen2/2.5/3)  "<|im_start|>" present.
//              <|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n
//              Thinking::kOff appends "<think>\n\n</think>\n\n" (Qwen3's enable_thinking=False)
//              when the template mentions enable_thinking. When the template carries Qwen2.5's
//              default system prompt ("You are Qwen, created by Alibaba Cloud. ...") and the chat
//              has no system message, that system message is added first, as Qwen2.5 does.
//   kGlm45     (GLM-4.5/4.6)  "[gMASK]" present, no "clear_thinking".
//              [gMASK]<sop><|system|>\n{sys}<|user|>\n{user}<|assistant|>
//              (newline after each role token; Thinking::kOff appends "\n<think></think>").
//   kGlm47     (GLM-4.7/GLM-5) "[gMASK]" and "clear_thinking" present.
//              [gMASK]<sop><|system|>{sys}<|user|>{user}<|assistant|><think>  (thinking) or
//              ...<|assistant|></think> (Thinking::kOff); no newline after role tokens.
//   kDeepSeekV3 "<｜User｜>" present.
//              <｜begin▁of▁sentence｜>{sys}<｜User｜>{user}<｜Assistant｜>{answer}<｜end▁of▁sentence｜>
//
// What is simplified (VERIFY against the checkpoint's template when exact prompt tokens matter):
// previous assistant turns are rendered verbatim (no reasoning stripping, no tool calls); roles
// other than system/user/assistant are rejected; the GLM variant is told apart by the
// clear_thinking marker only. Kimi's template (<|im_user|>) is recognised but not supported.
//
// Failure: an unrecognised template, or a chat that the format cannot express, throws
// CheckpointError saying which markers were looked for. Thread safety: immutable value type.
#ifndef RL_TRAINER_DATA_CHAT_TEMPLATE_H_
#define RL_TRAINER_DATA_CHAT_TEMPLATE_H_

#include <string>
#include <string_view>
#include <vector>

namespace rl::data {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

enum class ChatFormat { kChatMl, kGlm45, kGlm47, kDeepSeekV3 };

enum class AddGenerationPrompt { kNo, kYes };
enum class Thinking { kDefault, kOff };

struct ChatTemplateOptions {
  AddGenerationPrompt add_generation_prompt = AddGenerationPrompt::kYes;
  Thinking thinking = Thinking::kDefault;
};

// "chatml", "glm45", "glm47", "deepseek_v3".
std::string_view ChatFormatName(ChatFormat format);
// The inverse of ChatFormatName (for a flag that forces the format); throws ConfigError.
ChatFormat ParseChatFormat(std::string_view name);

class ChatTemplate {
 public:
  // The format of a Jinja chat template, by its markers; throws CheckpointError when none match.
  static ChatTemplate Recognize(std::string_view jinja_source);
  explicit ChatTemplate(ChatFormat format) : format_(format) {}

  ChatFormat format() const { return format_; }

  // The prompt text for `messages` (special tokens written as text; Tokenizer::Encode matches
  // them). Throws CheckpointError for an empty chat or an unsupported role.
  std::string Apply(const std::vector<ChatMessage>& messages,
                    const ChatTemplateOptions& options = {}) const;

 private:
  ChatFormat format_;
  std::string default_system_;  // kChatMl: Qwen2.5's implicit system prompt, else empty
  bool mentions_thinking_ = false;
};

}  // namespace rl::data

#endif  // RL_TRAINER_DATA_CHAT_TEMPLATE_H_
