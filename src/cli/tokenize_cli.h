/*
 * tokenize_cli — the `shardlm tokenize` command: encodes a text with a Hugging
 * Face tokenizer.json (tokenizer.h) and prints the ids as a JSON array, or
 * decodes a JSON array of ids and prints the text. For tests (the ids against
 * Python's tokenizers) and for users checking what a model will read.
 * Called by main.c.
 */
#ifndef SHARDLM_TOKENIZE_CLI_H
#define SHARDLM_TOKENIZE_CLI_H

/* argv[0] is "tokenize"; returns the process exit status. */
int cmd_tokenize(int argc, char **argv);

#endif
