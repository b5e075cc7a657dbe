/*
 * toolcall.h — tool calls in a chat model's reply, as the OpenAI API returns them (message.tool_calls).
 *
 * Each model family writes calls in the form its chat template taught it; the reply is plain text in which the
 * first opening marker of a known form starts the calls and ends the content:
 *   hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call> ...        (Qwen2.5, Qwen3, Qwen3-MoE)
 *   kimi_k2      <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{...}
 *                <|tool_call_end|> ... <|tool_calls_section_end|>                    (Kimi-K2; the call id is kept)
 *   deepseek_v3  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```
 *                <｜tool▁call▁end｜> ... <｜tool▁calls▁end｜>, and V3.1's NAME<｜tool▁sep｜>{...} inside a call
 * A reply whose calls do not parse (bad JSON, a missing end marker, text after the calls) is left as content, the
 * rule vLLM's parsers follow: a client then sees what the model wrote.
 */
#ifndef MOET_SERVER_TOOLCALL_H
#define MOET_SERVER_TOOLCALL_H

#include <stddef.h>

#include <jansson.h>

/* Where the calls of a reply (n bytes) may start: the offset of the first opening marker, or n when there is none;
 * *partial (n when there is none) is the offset of a tail that is the start of a marker, so a stream holds back
 * from min(first, *partial). */
size_t toolcall_find(const char *text, size_t n, size_t *partial);

/* The reply's tool calls: a JSON array of {"id", "type": "function", "function": {"name", "arguments": JSON text}}
 * (ids "call_<k>_<id_suffix>" unless the form carries its own), and *content_len, the length of the text before
 * the calls without trailing whitespace. NULL when there are none or they do not parse. */
json_t *toolcall_parse(const char *text, size_t n, const char *id_suffix, size_t *content_len);

#endif
