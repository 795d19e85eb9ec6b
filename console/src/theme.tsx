/** Light and dark themes: the system's choice unless the user picks one (kept in this browser). */
import { useState } from 'preact/hooks';

type Theme = 'light' | 'dark' | 'system';
const KEY = 'gpucloud.theme';

export function applyTheme(t: Theme = (localStorage.getItem(KEY) as Theme | null) ?? 'system'): void {
  if (t === 'system') delete document.documentElement.dataset.theme;
  else document.documentElement.dataset.theme = t;
}

export function ThemeToggle() {
  const [theme, setTheme] = useState<Theme>((localStorage.getItem(KEY) as Theme | null) ?? 'system');
  const next: Record<Theme, Theme> = { system: 'dark', dark: 'light', light: 'system' };
  return (
    <button
      type="button"
      class="btn btn-plain"
      title={`Theme: ${theme} (click for ${next[theme]})`}
      aria-label={`Theme: ${theme}`}
      onClick={() => {
        const t = next[theme];
        if (t === 'system') localStorage.removeItem(KEY);
        else localStorage.setItem(KEY, t);
        applyTheme(t);
        setTheme(t);
      }}
    >
      {theme === 'dark' ? '☾' : theme === 'light' ? '☀' : '◐'}
    </button>
  );
}
