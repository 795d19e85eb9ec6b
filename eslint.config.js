// `npm run lint`: ESLint with typescript-eslint's recommended rules, Prettier's formatting (lines of at most 120
// characters; long strings and URLs may run past it).
import js from '@eslint/js';
import tseslint from 'typescript-eslint';
import prettier from 'eslint-config-prettier';
import globals from 'globals';

export default tseslint.config(
  { ignores: ['dist/**', 'node_modules/**', 'coverage/**', 'src/sdk/schema.ts', '.test-build-*/**'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  prettier,
  {
    languageOptions: { globals: { ...globals.node, ...globals.browser } },
    rules: {
      'max-len': [
        'error',
        { code: 120, ignoreStrings: true, ignoreTemplateLiterals: true, ignoreRegExpLiterals: true, ignoreUrls: true },
      ],
      '@typescript-eslint/no-unused-vars': [
        'error',
        { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrorsIgnorePattern: '^_', ignoreRestSiblings: true },
      ],
    },
  },
  {
    // Tests and scripts read untyped JSON answers freely.
    files: ['test/**', 'scripts/**', 'bench/**'],
    rules: {
      '@typescript-eslint/no-explicit-any': 'off',
      // `{}` is the type-level "nothing added" of the test world's conditional handles.
      '@typescript-eslint/no-empty-object-type': ['error', { allowObjectTypes: 'always' }],
    },
  },
);
