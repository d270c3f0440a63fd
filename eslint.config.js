// Lint rules of rxrl: ESLint's recommended set and typescript-eslint's, over every TypeScript source. Formatting
// is Prettier's (.prettierrc.json); `npm test` runs both checks before the specs (`npm run lint`).
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['dist/', 'node_modules/', '.cache/', 'runs/', 'spec/fixtures/', 'lib/kafka/schema/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    files: ['**/*.ts'],
    languageOptions: { parserOptions: { ecmaVersion: 2022, sourceType: 'module' } },
    rules: {
      // An unused binding named with a leading underscore is deliberate (a destructured field left out).
      '@typescript-eslint/no-unused-vars': [
        'error',
        { argsIgnorePattern: '^_', varsIgnorePattern: '^_', destructuredArrayIgnorePattern: '^_' },
      ],
    },
  },
);
