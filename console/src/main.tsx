import { render } from 'preact';
import { App } from './app.js';
import { applyTheme } from './theme.js';
import './styles.css';

applyTheme();
render(<App />, document.getElementById('app')!);
