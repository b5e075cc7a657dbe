/*
 * jinja.h — the Jinja subset that Hugging Face chat templates are written in.
 *
 * Models ship their prompt format as a Jinja template (tokenizer_config.json "chat_template" or chat_template.jinja)
 * and transformers renders it with jinja2's ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) plus
 * the loopcontrols extension, raise_exception(), strftime_now() and a tojson that keeps non-ASCII. This interpreter
 * renders those templates the same way, byte for byte (tests/fixtures/chat_templates.json holds jinja2's own output
 * for the cases tested): statements for/if/elif/else/set (also block set and namespace attributes)/macro/break/
 * continue/generation/raw, the expression grammar with jinja2's precedence, the filters, tests, string and dict
 * methods real templates call, and Python's str() of values.
 *
 * Safety: a template comes from a model directory and its variables from an HTTP request, so rendering is bounded
 * (evaluation steps, output bytes, nesting depth, memory) and every failure is an error message, never a crash.
 */
#ifndef MOET_JINJA_H
#define MOET_JINJA_H

#include <stddef.h>

#include <jansson.h>

typedef struct jinja_template jinja_template;

/* Parses src (len bytes). Returns NULL with a message (naming the line) on a syntax error. */
jinja_template *jinja_compile(const char *src, size_t len, char *err, size_t errlen);
void jinja_free(jinja_template *t);

/* Renders with the members of vars (a JSON object) as the template's variables. *out is malloc'd and
 * NUL-terminated, *out_len without the NUL. Returns 0, or -1 with a message (raise_exception's text, an undefined
 * name's, a limit's). */
int jinja_render(const jinja_template *t, json_t *vars, char **out, size_t *out_len, char *err, size_t errlen);

#endif
